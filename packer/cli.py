"""The ``packer`` command: a thin layer that parses options, calls one library function and
prints the result. Every PackerError becomes one line on stderr and exit status 1."""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any, NoReturn

import click

from packer import __version__
from packer.check import StoreSummary, describe_store
from packer.errors import PackerError, PackInterrupted, UsageError
from packer.options import PackOptions, parse_hw, parse_size
from packer.pack import PackResult, pack
from packer.store import backend_for_path
from packer.terminal import ProgressLine, bar, human_bytes

__all__ = ["main", "cli"]


class _Group(click.Group):
    """Translates library errors once, for every command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PackInterrupted as e:
            click.echo(f"packer: {e}", err=True)
            ctx.exit(130)
        except PackerError as e:
            raise click.ClickException(str(e)) from e


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="packer")
def cli() -> None:
    """Pack a folder of images into pre-shuffled LMDB or HDF5 shards, and look inside them."""


@cli.command("pack")
@click.argument("source", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("output", type=click.Path(path_type=Path))
@click.option(
    "--labels",
    default="folders",
    show_default=True,
    metavar="folders|none|FILE",
    help="Class sub-folders, no labels, or a CSV/TSV file with a path column and label columns.",
)
@click.option(
    "--path-column",
    metavar="NAME",
    help="CSV column with the paths (default: path/file/filename/image, else the first).",
)
@click.option(
    "--label-column",
    "label_columns",
    multiple=True,
    metavar="NAME",
    help="CSV column to use as a label; repeat for several (default: all but the path column).",
)
@click.option(
    "--backend",
    type=click.Choice(["lmdb", "hdf5"]),
    help="Default: from OUTPUT's suffix (.lmdb, .h5).",
)
@click.option(
    "--seed", type=int, help="Shuffle seed (default: a random one, recorded in the manifest)."
)
@click.option("--no-shuffle", is_flag=True, help="Keep sorted path order.")
@click.option("--raw", is_flag=True, help="Store decoded uint8 pixels, so training skips decoding.")
@click.option("--encode", type=click.Choice(["jpeg", "png", "webp"]), help="Re-encode every image.")
@click.option(
    "--quality",
    type=click.IntRange(1, 100),
    default=90,
    show_default=True,
    help="JPEG/WebP quality.",
)
@click.option(
    "--max-side",
    type=click.IntRange(min=1),
    metavar="PX",
    help="Shrink so the longest side is at most PX.",
)
@click.option("--size", "size_text", metavar="HxW", help="Resize to exactly HxW (see --fit).")
@click.option(
    "--fit",
    type=click.Choice(["crop", "pad", "stretch"]),
    default="crop",
    show_default=True,
    help="With --size: crop the centre, pad with black, or stretch.",
)
@click.option(
    "--mode",
    type=click.Choice(["RGB", "L", "keep"]),
    default="RGB",
    show_default=True,
    help="Colour policy when pixels are decoded (keep: L, LA, RGB or RGBA as in the file).",
)
@click.option(
    "--shard-size",
    default="1GB",
    show_default=True,
    metavar="SIZE",
    help="Target shard size, e.g. 512MB.",
)
@click.option(
    "--shards", type=click.IntRange(min=1), help="Exactly N shards of equal record counts instead."
)
@click.option(
    "--compression",
    type=click.Choice(["gzip", "lzf"]),
    help="HDF5 compression (worth it for --raw only).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    help="Worker processes [default: all cores].",
)
@click.option(
    "--check",
    type=click.Choice(["full", "header"]),
    default="full",
    show_default=True,
    help="full: decode every image (catches truncation); header: parse headers only (faster).",
)
@click.option(
    "--on-error",
    type=click.Choice(["skip", "fail"]),
    default="skip",
    show_default=True,
    help="Bad files: report and skip them, or stop the pack.",
)
@click.option(
    "--max-pixels",
    type=click.IntRange(min=1),
    default=PackOptions.max_pixels,
    show_default=True,
    help="Refuse larger images (decompression bombs) before decoding them.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing store at OUTPUT.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def pack_command(
    source: Path,
    output: Path,
    size_text: str | None,
    shard_size: str,
    label_columns: tuple[str, ...],
    backend: str | None,
    quiet: bool,
    as_json: bool,
    **kwargs: Any,
) -> None:
    """Pack the images under SOURCE into a new store at OUTPUT.

    \b
    Example:
        packer pack ./imgs out.lmdb
        packer pack ./imgs out.h5 --labels labels.csv --max-side 256
    """
    backend = backend or backend_for_path(output)
    if backend is None:
        raise UsageError(f"{output}: name it .lmdb or .h5, or pass --backend lmdb|hdf5")
    options = PackOptions(
        backend=backend,
        size=parse_hw(size_text) if size_text else None,
        shard_size=parse_size(shard_size),
        label_columns=list(label_columns) or None,
        shuffle=not kwargs.pop("no_shuffle"),
        **kwargs,
    )
    line = ProgressLine(enabled=not quiet)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a kill leaves no store, as Ctrl-C does
    try:
        result = pack(source, output, options, progress=lambda p: line(p.stage, p.done, p.total))
    finally:
        line.finish()
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=1))
    elif not quiet:
        _print_pack_summary(result)


def _interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _print_pack_summary(result: PackResult) -> None:
    s = result.to_json()
    click.echo(
        f"packed {s['packed']} images into {s['store']} ({s['backend']}, {s['shards']} shard"
        f"{'s' if s['shards'] != 1 else ''}, {human_bytes(s['store_bytes'])}) "
        f"in {s['seconds']:.1f}s: {s['images_per_s']:,.0f} images/s, {s['mb_per_s']:,.1f} MB/s"
    )
    click.echo(f"seed {s['seed']}")
    if result.skipped:
        click.echo(f"skipped {len(result.skipped)} files:")
        for reason, count in result.skipped_by_reason().most_common():
            click.echo(f"  {count:6}  {reason}")
        for skipped in result.skipped[:10]:
            click.echo(f"  {skipped.path}: {skipped.reason}")
        if len(result.skipped) > 10:
            click.echo(
                f"  ... and {len(result.skipped) - 10} more (packer inspect --json lists all)"
            )


@cli.command("inspect")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--images", metavar="NODE", help="A plain HDF5 file: the image array, e.g. /samples.")
@click.option("--labels", metavar="NODE", help="A plain HDF5 file: the label array, e.g. /labels.")
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON.")
def inspect_command(store: Path, images: str | None, labels: str | None, as_json: bool) -> None:
    """Show what is in STORE: records, shards, classes, sizes, how it was made.

    STORE is a packer store, or a plain HDF5 file with an image array and a label array.

    \b
    Example:
        packer inspect out.lmdb
        packer inspect train.h5 --images /samples --labels /labels
    """
    summary = describe_store(store, images=images, labels=labels)
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=1, ensure_ascii=False))
    else:
        _print_summary(summary)
    if not summary.ok:
        sys.exit(1)


def _print_summary(summary: StoreSummary) -> None:
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
        echo(f"width     {w['min']}..{w['max']} px, mean {w['mean']:.0f}")
        echo(
            f"bytes     {human_bytes(b['min'])}..{human_bytes(b['max'])}, mean {human_bytes(b['mean'])}"
        )
    if m.backend == "pytables":
        echo("shuffle   unknown (the reader's chunk reshuffle is all the mixing there is)")
    else:
        echo(f"shuffle   {'seed ' + str(m.seed) if m.shuffled else 'none (sorted path order)'}")
    _print_labels(m.label_source, m.label_columns, stats.get("label_counts", []))
    echo(f"skipped   {len(m.skipped)} file(s)")
    reasons = Counter(s["reason"] for s in m.skipped)
    for reason, count in reasons.most_common(5):
        echo(f"  {count:6}  {reason}")
    echo("shards")
    for shard in m.shards:
        echo(
            f"  {shard.file}  {shard.num_records:>9,} records  {human_bytes(shard.bytes):>9}  sha256 {shard.sha256[:12]}"
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


def main() -> None:
    cli(prog_name="packer")
