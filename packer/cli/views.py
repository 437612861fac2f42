"""What `packer inspect` prints: text for people (the CLI prints JSON for scripts itself)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import click

from packer.cli.terminal import bar, human_bytes
from packer.inspect.summary import StoreSummary
from packer.store.verify import VerifyReport

__all__ = ["print_summary", "print_verify", "print_look"]


def print_summary(summary: StoreSummary) -> None:
    """What `packer inspect STORE` prints."""
    m = summary.manifest
    st = m.storage
    stats = m.stats
    on_disk = sum(s.bytes for s in m.shards)
    payload = sum(s.payload_bytes for s in m.shards)
    echo = click.echo
    if m.backend == "pytables":
        arrays = f"images {m.options['images']}, labels {m.options['labels'] or 'none'}"
        echo(f"{summary.path}: plain HDF5 file read as a raw store ({arrays}); no checksums")
    else:
        echo(
            f"{summary.path}: packer store v{m.format_version}, {m.backend}, made by packer {m.packer_version} on {m.created}"
        )
    echo(
        f"records   {m.num_records:,} in {len(m.shards)} shard(s); payload {human_bytes(payload)}, on disk {human_bytes(on_disk)}"
    )
    formats = ", ".join(f"{k} {v:,}" for k, v in stats.get("formats", {}).items())
    what = {
        "original": "original file bytes",
        "encoded": f"re-encoded {st.encoding}",
        "raw": "raw uint8 pixels",
    }[st.payload]
    resize = (
        f", max side {st.max_side}"
        if st.max_side
        else f", size {st.size[0]}x{st.size[1]} ({st.fit})"
        if st.size
        else ""
    )
    echo(f"storage   {what}{resize}; colour {st.mode}; formats: {formats}")
    if st.shape:
        echo(f"shape     every image {st.shape[0]}x{st.shape[1]}x{st.shape[2]}")
    h, w, b = stats.get("height", {}), stats.get("width", {}), stats.get("payload_bytes", {})
    if h.get("count"):
        echo(f"height    {h['min']}..{h['max']} px, mean {h['mean']:.0f}")
        _print_histogram(h, lambda v: f"{v} px")
        echo(f"width     {w['min']}..{w['max']} px, mean {w['mean']:.0f}")
        _print_histogram(w, lambda v: f"{v} px")
        echo(
            f"bytes     {human_bytes(b['min'])}..{human_bytes(b['max'])}, mean {human_bytes(b['mean'])}"
        )
        _print_histogram(b, human_bytes)
    if m.backend == "pytables":
        echo("shuffle   unknown (the reader's chunk reshuffle is all the mixing there is)")
    else:
        echo(f"shuffle   {'seed ' + str(m.seed) if m.shuffled else 'none (sorted path order)'}")
    appends = m.source.get("appends") if isinstance(m.source, dict) else None
    for grown in appends if isinstance(appends, list) else []:
        try:
            last = grown["first_shard"] + grown["shards"] - 1
            echo(
                f"appended  {grown['records']:,} records as shards {grown['first_shard']}..{last}"
                f" on {grown['created']} (seed {grown['seed']}, from {grown['root']})"
            )
        except (KeyError, TypeError, ValueError):  # an odd manifest: say so, don't fail
            echo(f"appended  (unreadable entry {str(grown)[:60]!r})")
    _print_labels(m.label_source, m.label_columns, stats.get("label_counts", []))
    echo(f"skipped   {len(m.skipped)} file(s)")
    reasons = Counter(s["reason"] for s in m.skipped)
    for reason, count in reasons.most_common(5):
        echo(f"  {count:6}  {reason}")
    echo("shards")
    for shard in m.shards:
        echo(
            f"  {shard.file}  {shard.num_records:>9,} records  {human_bytes(shard.bytes):>9}  "
            f"{shard.checksum[: shard.checksum.find(':') + 13]}"
        )
    for problem in summary.problems:
        echo(f"PROBLEM   {problem}", err=True)


def _print_labels(source: str, columns: list[dict[str, Any]], counts: list[dict[str, int]]) -> None:
    if source == "none" or not columns:
        click.echo("labels    none")
        return
    origin = {"folders": "class folders", "csv": "a labels file", "arrays": "the label array"}[
        source
    ]
    click.echo(f"labels    from {origin}")
    for column, column_counts in zip(columns, counts):
        classes = column.get("classes")
        rows = [(classes[int(k)] if classes else k, n) for k, n in column_counts.items()]
        kind = f"{len(classes)} classes" if classes else f"{len(rows)} integer values"
        click.echo(f"  {column['name']}: {kind}")
        top = max((n for _, n in rows), default=1)
        width = max((len(str(name)) for name, _ in rows[:30]), default=1)
        for name, n in rows[:30]:
            click.echo(f"    {str(name):<{width}}  {n:>8,}  {bar(n / top, 30)}")
        if len(rows) > 30:
            click.echo(f"    ... {len(rows) - 30} more (--json lists all)")


def _print_histogram(distribution: dict[str, Any], label: Any) -> None:
    """The power-of-two histogram a manifest keeps for sizes, as bars (one row per bucket)."""
    buckets = {int(k): n for k, n in (distribution.get("histogram") or {}).items()}
    if len(buckets) < 2:
        return
    top = max(buckets.values())
    for low, n in sorted(buckets.items()):
        span = f"{label(low)}..{label(max(2 * low - 1, 0))}"
        click.echo(f"  {span:>22} {n:>9,}  {bar(n / top, 30)}")


def print_verify(report: VerifyReport) -> None:
    """What `packer inspect STORE --verify` prints."""
    echo = click.echo
    verdict = "OK" if report.ok else f"{len(report.problems)} PROBLEM(S)"
    echo(
        f"{report.store}: {verdict}: {report.records_checked:,} records in "
        f"{report.shards_checked} shard(s) checked in {report.seconds:.1f}s"
    )
    for p in report.problems:
        where = p.shard + (f" record {p.index}" if p.index is not None else "")
        echo(f"  {where}{f' ({p.path})' if p.path else ''}: {p.reason}", err=True)


def print_look(action: str, result: Any) -> None:
    """What `packer inspect` prints for --grid, --head/--index, --extract, --shuffle, --bench."""
    echo = click.echo
    if action == "grid":
        echo(
            f"wrote {result['grid']}: {len(result['indices'])} images (records {_short(result['indices'])})"
        )
    elif action in ("head", "index"):
        for r in result:
            labels = ", ".join(
                str(c if c is not None else v) for v, c in zip(r["labels"], r["classes"])
            )
            h, w, c = r["shape"]
            echo(
                f"{r['index']:>9}  {r['shard']}[{r['offset']}]  {labels or '-':<12}  {h}x{w}x{c}  "
                f"{r['format']:<5} {human_bytes(r['bytes']):>9}  {r['path']}"
            )
    elif action == "extract":
        echo(f"wrote record {result['index']} to {result['written']}")
    elif action == "shuffle":
        _print_shuffle(result)
    else:
        what = {
            "device": "device    (the files, front to back)",
            "reader": "reader    (shuffled, not decoded)",
            "decoded": "decoded   (shuffled, decoded)",
        }
        for name, label in what.items():
            part = result[name]
            echo(
                f"{label:38} {part['mb_per_s']:>8,.1f} MB/s {part['images_per_s']:>9,.0f} images/s"
                f"  ({part['images']:,} images in {part['seconds']:.1f}s"
                f"{'' if part['complete'] else ', cut short'})"
            )
        if not result["cold"]:
            echo(
                "the page cache could not be dropped: these are figures of memory, not of the device"
            )
        echo(result["verdict"])
        fast = result["accelerators"]
        echo(f"JPEGs decoded by {fast['jpeg']}; CRC-32 by {fast['crc32']}")


def print_mixture(result: dict[str, Any]) -> None:
    """What `packer inspect A B --mix ...` prints: an epoch of the mixture, store by store."""
    echo = click.echo
    echo(f"epoch {result['epoch']} (seed {result['seed']}): {result['records']:,} records")
    for source in result["sources"]:
        echo(
            f"  {source['name']}: {source['records']:,} records, {source['share']:.1%} "
            f"(weight {source['weight']:.1%}); {source['passes']:.2f}x its "
            f"{source['store_records']:,} records, {source['distinct']:,} distinct"
        )
        classes = sorted(source["classes"].items(), key=lambda kv: -kv[1])
        for name, count in classes[:20]:
            share = count / source["records"] if source["records"] else 0.0
            echo(f"      {name:<24} {count:>10,}  {share:6.1%}")
        if len(classes) > 20:
            echo(f"      ... and {len(classes) - 20} more classes (--json lists all)")


def _print_shuffle(result: dict[str, Any]) -> None:
    echo = click.echo
    stored, reader = result["stored"], result["reader"]
    echo(
        f"{result['records']:,} records, {result['classes']} classes; a ratio near 1 is as good as a full random shuffle"
    )
    echo("stored order")
    echo(
        f"  label runs    mean {stored['mean_run']:.2f} (random {stored['random_mean_run']:.2f}), ratio {stored['run_ratio']:.2f}"
    )
    echo(
        f"  per chunk     label distribution off the global one by {stored['chunk_tv']:.3f} (random {stored['random_chunk_tv']:.3f}), ratio {stored['tv_ratio']:.2f}"
    )
    echo(
        f"reader order   chunk_size {result['chunk_size']}, buffer_chunks {result['buffer_chunks']}, batch_size {result['batch_size']}"
    )
    echo(
        f"  label runs    mean {reader['mean_run']:.2f} (random {reader['random_mean_run']:.2f}), ratio {reader['run_ratio']:.2f}"
    )
    echo(
        f"  per batch     label distribution off the global one by {reader['batch_tv']:.3f} (random {reader['random_batch_tv']:.3f}), ratio {reader['tv_ratio']:.2f}"
    )


def _short(indices: list[int]) -> str:
    text = ", ".join(map(str, indices[:8]))
    return text + (f", ... ({len(indices) - 8} more)" if len(indices) > 8 else "")
