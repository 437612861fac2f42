"""The ``packer`` command: a thin layer that parses options, calls one library function and
prints the result. Every PackerError becomes one line on stderr and exit status 1."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from packer.arguments import check_seed, parse_hw, parse_size
from packer.cli import views
from packer.cli.terminal import ProgressLine, human_bytes
from packer.cli.version import version_lines, versions
from packer.errors import PackerError, PackInterrupted, UsageError
from packer.inspect import look, shuffle_report
from packer.inspect.convert import convert_store
from packer.inspect.mix_report import mixture_epoch
from packer.inspect.summary import describe_store
from packer.inspect.unpack import unpack_store
from packer.packing.options import PackOptions
from packer.packing.pipeline import PackResult, pack
from packer.store import backend_for_path
from packer.store.access import Store, open_store
from packer.store.verify import verify_store

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


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        _echo_versions(as_json=False)
        ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_print_version,
    help="Which packer this is, its libraries' versions, the store formats; see `packer version`.",
)
def cli() -> None:
    """Pack a folder of images into pre-shuffled LMDB or HDF5 shards, and look inside them.

    This is packer from the packer-image-shards distribution, not HashiCorp's Packer;
    `python -m packer` runs it wherever another `packer` comes first on the PATH.
    """


@cli.command("version")
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON.")
def version_command(as_json: bool) -> None:
    """Which packer this is (not HashiCorp's Packer, also a `packer` command), the versions of
    the libraries that read, write and decode stores, and the store formats it writes and reads:
    paste it into a bug report.

    \b
    Example:
        packer version
        packer version --json
    """
    _echo_versions(as_json)


def _echo_versions(as_json: bool) -> None:
    found = versions()
    if as_json:
        _echo_json(found)
    else:
        click.echo("\n".join(version_lines(found)))


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
@click.option(
    "--resume",
    is_flag=True,
    help="Require an unfinished pack of the same inputs and options to continue "
    "(the same command resumes one anyway; this refuses to start over).",
)
@click.option(
    "--append",
    is_flag=True,
    help="Add the images to the existing store OUTPUT as new shards, stored the way its "
    "others are; existing records and class indices stay as they are.",
)
@click.option(
    "--dask",
    metavar="ADDRESS",
    help="Write the shards on a Dask cluster: a scheduler address (tcp://host:8786) or "
    "local:N for N worker processes here. OUTPUT must be on storage every worker sees.",
)
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
    except KeyboardInterrupt:  # before any shard was staged (the scan, the plan)
        raise PackInterrupted(f"interrupted: nothing was written to {output}") from None
    finally:
        line.finish()
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=1))
    elif quiet:
        pass
    elif result.already_added is not None:
        click.echo(
            f"nothing to add: {output} already holds {source}, the same files and labels "
            f"({result.already_added}); nothing was written"
        )
    else:
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
    if result.appended_to:
        click.echo(
            f"appended: the store held {result.appended_to} images; it now holds "
            f"{s['store_records']} in {s['shards']} shards"
        )
    if result.kept_shards:
        click.echo(
            f"resumed: {result.kept_shards} shards ({result.kept_records} images) were kept "
            "from the interrupted run; the figures above are this run's"
        )
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
@click.argument("stores", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--verify", is_flag=True, help="Read every record: checksums, decoding, shard hashes."
)
@click.option("--no-decode", is_flag=True, help="With --verify: checksums only, no image decoding.")
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    help="With --verify: threads that decode [default: all cores].",
)
@click.option(
    "--grid",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PNG",
    help="Write a contact sheet of sample images with their labels.",
)
@click.option("--class", "class_name", metavar="NAME", help="With --grid: only this class.")
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="With --grid: images on the sheet.",
)
@click.option("--head", type=click.IntRange(min=0), metavar="N", help="List the first N records.")
@click.option("--index", type=click.IntRange(min=0), metavar="I", help="List record I.")
@click.option(
    "--extract",
    nargs=2,
    type=(int, click.Path(dir_okay=False, path_type=Path)),
    metavar="I OUT",
    help="Write record I's image to OUT.",
)
@click.option(
    "--shuffle",
    is_flag=True,
    help="How well mixed the stored order is, and what the reader makes of it.",
)
@click.option(
    "--chunk-size", type=click.IntRange(min=1), help="With --shuffle: the reader's chunk_size."
)
@click.option(
    "--buffer-chunks",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="With --shuffle: the reader's buffer_chunks.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="With --shuffle or --bench.",
)
@click.option(
    "--bench",
    is_flag=True,
    help="Read the store cold three ways (its files, the reader, decoding): which is the limit.",
)
@click.option(
    "--mix",
    metavar="W1,W2,...",
    help="Several stores: what an epoch of their mixture with these weights would hold, "
    "per store and class.",
)
@click.option(
    "--epoch-size",
    type=click.IntRange(min=1),
    metavar="N",
    help="With --mix: records per epoch [default: until the scarcest store has given each once].",
)
@click.option(
    "--epoch", type=click.IntRange(min=0), default=0, show_default=True, help="With --mix."
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="With --grid, --shuffle or --mix."
)
@click.option("--images", metavar="NODE", help="A plain HDF5 file: the image array, e.g. /samples.")
@click.option("--labels", metavar="NODE", help="A plain HDF5 file: the label array, e.g. /labels.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def inspect_command(
    stores: tuple[Path, ...], images: str | None, labels: str | None, as_json: bool, **what: Any
) -> None:
    """Show what is in STORE: records, shards, classes, sizes, how it was made; or, with one of
    the options, verify it, list or extract records, draw samples, measure the shuffle or the
    read speed.

    STORE is a packer store, or a plain HDF5 file with an image array and a label array;
    several stores with --mix.

    \b
    Example:
        packer inspect out.lmdb
        packer inspect out.lmdb --verify
        packer inspect out.lmdb --grid sample.png --class cat
        packer inspect out.lmdb --head 10
        packer inspect out.lmdb --extract 12 twelve.jpg
        packer inspect out.lmdb --shuffle --chunk-size 512 --buffer-chunks 8
        packer inspect train.h5 --images /samples --labels /labels
        packer inspect photos.lmdb sketches.h5 --mix 0.7,0.3
    """
    check_seed(what["seed"])
    actions = [
        a
        for a in ("verify", "grid", "head", "index", "extract", "shuffle", "bench", "mix")
        if what[a] not in (None, False)
    ]
    if len(actions) > 1 and set(actions) != {"head", "index"}:
        raise UsageError(f"choose one of --{', --'.join(actions)}")
    action = actions[0] if actions else "summary"
    if action == "mix":
        result = mixture_epoch(
            stores,
            _weights(what["mix"], len(stores)),
            epoch_size=what["epoch_size"],
            seed=what["seed"],
            epoch=what["epoch"],
            images=images,
            labels=labels,
        )
        if as_json:
            _echo_json(result)
        else:
            views.print_mixture(result)
        return
    if len(stores) > 1:
        raise UsageError(f"{len(stores)} stores given: inspect takes one, or several with --mix")
    (store,) = stores
    if action == "verify":
        _inspect_verify(store, not what["no_decode"], what["workers"], as_json)
        return
    if action == "summary":
        summary = describe_store(store, images=images, labels=labels)
        if as_json:
            _echo_json(summary.to_json())
        else:
            views.print_summary(summary)
        if not summary.ok:
            sys.exit(1)
        return
    with open_store(store, images=images, labels=labels) as opened:
        result = _look(opened, action, what)
    if as_json:
        _echo_json(result)
    else:
        views.print_look(action, result)


def _look(store: Store, action: str, what: dict[str, Any]) -> Any:
    if action == "grid":
        shown = look.contact_sheet(
            store,
            what["grid"],
            count=what["count"],
            seed=what["seed"],
            class_name=what["class_name"],
        )
        return {"grid": str(what["grid"]), "indices": shown}
    if action in ("head", "index"):
        return look.list_records(store, head=what["head"], index=what["index"])
    if action == "extract":
        index, out = what["extract"]
        return {"index": index, "written": str(look.extract(store, index, out))}
    if action == "shuffle":
        return shuffle_report.shuffle_quality(
            store,
            chunk_size=what["chunk_size"],
            buffer_chunks=what["buffer_chunks"],
            seed=what["seed"],
            batch_size=what["batch_size"],
        )
    return look.bench_store(store, batch_size=what["batch_size"])


def _weights(text: str, count: int) -> list[float]:
    """``--mix 0.7,0.3``: one weight per store, in their order."""
    try:
        weights = [float(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--mix takes numbers separated by commas, not {text!r}") from None
    if len(weights) != count:
        raise UsageError(f"--mix gives {len(weights)} weights for {count} stores: one per store")
    return weights


def _inspect_verify(store: Path, decode: bool, workers: int, as_json: bool) -> None:
    line = ProgressLine(enabled=not as_json)
    try:
        report = verify_store(
            store,
            decode=decode,
            progress=lambda done, total: line("verify", done, total),
            workers=workers,
        )
    finally:
        line.finish()
    if as_json:
        _echo_json(report.to_json())
    else:
        views.print_verify(report)
    if not report.ok:
        sys.exit(1)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=1, ensure_ascii=False))


@cli.command("unpack")
@click.argument("store", type=click.Path(exists=True, path_type=Path))
@click.argument("outdir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--layout",
    type=click.Choice(["paths", "classes"]),
    default="paths",
    show_default=True,
    help="paths: each file at its original relative path; classes: OUTDIR/<class>/<name>.",
)
@click.option("--overwrite", is_flag=True, help="Write into an existing, non-empty OUTDIR.")
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    help="Threads that encode raw pixels as PNG [default: all cores].",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def unpack_command(
    store: Path,
    outdir: Path,
    layout: str,
    overwrite: bool,
    workers: int,
    quiet: bool,
    as_json: bool,
) -> None:
    """Write every record of STORE back as a file under OUTDIR.

    Stores of original bytes give back files byte-identical to the packed ones.

    \b
    Example:
        packer unpack out.lmdb ./restored
        packer unpack out.lmdb ./by-class --layout classes
    """
    line = ProgressLine(enabled=not quiet)
    try:
        result = unpack_store(
            store,
            outdir,
            layout=layout,
            overwrite=overwrite,
            progress=lambda done, total: line("unpack", done, total),
            workers=workers,
        )
    finally:
        line.finish()
    data = result.to_json()
    if as_json:
        _echo_json(data)
    elif not quiet:
        click.echo(
            f"wrote {data['files']:,} files ({human_bytes(data['bytes'])}) to {data['outdir']} in {data['seconds']:.1f}s"
        )


@cli.command("convert")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.argument("dest", type=click.Path(path_type=Path))
@click.option(
    "--backend",
    type=click.Choice(["lmdb", "hdf5"]),
    help="Default: from DEST's suffix (.lmdb, .h5).",
)
@click.option(
    "--shard-size", metavar="SIZE", help="Cut new shards of about SIZE (default: the same shards)."
)
@click.option("--overwrite", is_flag=True, help="Replace an existing store at DEST.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def convert_command(
    source: Path,
    dest: Path,
    backend: str | None,
    shard_size: str | None,
    overwrite: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Copy the store SOURCE into a new store DEST of the other backend, without decoding:
    same records, order, labels, paths and checksums.

    \b
    Example:
        packer convert out.lmdb out.h5
    """
    line = ProgressLine(enabled=not quiet)
    try:
        manifest = convert_store(
            source,
            dest,
            backend=backend,
            overwrite=overwrite,
            shard_size=parse_size(shard_size) if shard_size else None,
            progress=lambda done, total: line("convert", done, total),
        )
    finally:
        line.finish()
    summary: dict[str, Any] = {
        "store": str(dest),
        "backend": manifest.backend,
        "records": manifest.num_records,
        "shards": len(manifest.shards),
        "bytes": sum(s.bytes for s in manifest.shards),
    }
    if as_json:
        _echo_json(summary)
    elif not quiet:
        click.echo(
            f"converted {summary['records']:,} records into {dest} ({manifest.backend}, "
            f"{summary['shards']} shard(s), {human_bytes(summary['bytes'])})"
        )


def main() -> None:
    cli(prog_name="packer")
