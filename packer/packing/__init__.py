"""The pack flow: a folder in, a pre-shuffled, sharded store out.

    scan, source  ->  options, shuffle  ->  prepare (worker processes)  ->  shard_job  ->  pipeline
    (files, labels)   (what and in which     (a file -> a record's         (one shard     (plan, pool,
                       order)                  bytes)                       file)          manifest)

ledger keeps what an unfinished pack has done so it can resume; append adds shards to a
finished store; dask_pack writes the shards on a Dask cluster; stats summarises the records.
"""
