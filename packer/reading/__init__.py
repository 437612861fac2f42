"""The read flow: a store to batches, read sequentially, reshuffled locally, prefetched.

    epoch (which chunks, in which order) -> readahead (their bytes, in large sequential reads)
      -> batching (a window of chunks -> shuffled batches, checked and decoded)
      -> produce (the background thread) -> packer.prefetch (a bounded queue) -> reader (you)

options checks what a reader is asked for; to_torch makes tensors and GPU copies.
"""
