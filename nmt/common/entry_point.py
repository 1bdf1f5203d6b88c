"""What the entry points share: a user's mistake (a bad key, setting, file or checkpoint, a place that cannot be
written) ends in one line, ``PROGRAM: error: MESSAGE`` on stderr, with exit status 2 and no traceback; a write that
fails mid-job (a full disk, no permission, an I/O error) ends in one line too, with exit status 74
(``EXIT_WRITE_STOPPED``).
"""

from __future__ import annotations

import logging
import shlex
import shutil
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.common.disk import (
    EXIT_WRITE_STOPPED,
    PathNotWritable,
    WriteStopped,
    check_writable,
    is_disk_full,
    is_write_error,
    write_stopped_message,
)
from nmt.common.hydra_plugins import hydra_plugin_problem, plugin_groups_help
from nmt.common.settings import check_command_line_keys, config_groups, unknown_group_option

# Where Hydra writes before the job starts: a bad one is a NotADirectoryError inside Hydra unless checked first.
HYDRA_DIRS = ("hydra.run.dir", "hydra.sweep.dir")
_MADE_RUN_DIRS: dict[Path, Path] = {}  # run dir -> the first of the folders Hydra made for it in this process


def fail(program: str, error: Exception | str, status: int = 2) -> NoReturn:
    """Print ``error`` on stderr as one line (``PROGRAM: error: ...``) and exit with ``status``."""
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    print(f"{program}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def check_keys_or_exit(program: str, config_dir: Path, config_name: str, args: Sequence[str], schema: type) -> None:
    """Exit with one line (status 2) when ``command_line_problem`` finds one, before Hydra starts."""
    if problem := command_line_problem(config_dir, config_name, args, schema):
        fail(program, problem)


def command_line_problem(config_dir: Path, config_name: str, args: Sequence[str], schema: type) -> str | None:
    """The one-line error for the first command-line mistake, else None: a key not in ``schema`` (naming the
    nearest), a config group that ``config_name`` does not take or an option it lacks, a Hydra plugin
    (``hydra/launcher=joblib``) that is not installed (naming its package and extra) or a key the plugin lacks."""
    groups = config_groups(config_dir, config_name)
    return (unknown_group_option(config_dir, args, groups)
            or hydra_plugin_problem(config_dir, config_name, args, schema, groups)
            or check_command_line_keys(config_dir, args, schema, groups))


def exit_with_help_if_asked(program: str, config_dir: Path, config_name: str, args: Sequence[str], about: str) -> None:
    """With ``--help`` or ``-h`` in ``args``: print ``about`` (the entry point's docstring), the config groups it
    takes with their options, its settings as composed with the other overrides, and Hydra's launcher and sweeper
    plugins (installed, and the extras that bring them); then exit 0. Hydra's own help would list every folder of
    ``config_dir``, the groups of the other entry points too.
    """
    if not any(arg in ("--help", "-h") for arg in args):
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    overrides = [arg for arg in args if "=" in arg and not arg.startswith("-")]
    try:
        with initialize_config_dir(config_dir=str(config_dir.absolute()), version_base="1.3"):
            settings = OmegaConf.to_yaml(compose(config_name, overrides=overrides))
    except HydraException as error:
        fail(program, error)
    groups = [f"  {group}: {', '.join(sorted(p.stem for p in (config_dir / group).glob('*.yaml')))}"
              for group in config_groups(config_dir, config_name)]
    print(about.strip(), "", "== Config groups (GROUP=OPTION) ==", *(groups or ["  none: settings only"]), "",
          "== Settings (key=value), as composed ==", settings.rstrip(), "",
          plugin_groups_help(), "", "Hydra's own options: --hydra-help", sep="\n")
    raise SystemExit(0)


def check_outputs_or_exit(program: str, args: Sequence[str], folders: Sequence[str] = (),
                          files: Sequence[str] = ()) -> None:
    """Exit with one line (status 2) when ``key=PATH`` on the command line names a place to write (Hydra's run dir,
    ``folders``, ``files``) that cannot be made, before Hydra or the job touches it. ``-`` (stdout) and values with
    ``${...}`` interpolations are left to the job.
    """
    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        if value in ("", "-") or "${" in value or key not in (*HYDRA_DIRS, *folders, *files):
            continue
        try:
            check_writable(value, key, folder=key not in files)
        except PathNotWritable as error:
            fail(program, error)


def check_options_or_exit(program: str, folders: Mapping[str, str | Path | None] | None = None,
                          reports: Mapping[str, str | Path | None] | None = None) -> None:
    """Exit with one line (status 2), before any work, when a place an option names cannot be written: ``folders``
    maps an option (``--out``) to a folder the command writes into, ``reports`` to a report path without extension
    (``PATH.json`` beside ``PATH.md``, ``PATH.png``). A value left out (``None``) is skipped.
    """
    places = [(option, path, True) for option, path in (folders or {}).items()]
    places += [(option, path and f"{path}.json", False) for option, path in (reports or {}).items()]
    for option, path, folder in places:
        if path is None:
            continue
        try:
            check_writable(path, option, folder=folder)
        except PathNotWritable as error:
            fail(program, error)


def check_config_folders_or_exit(program: str, config_dir: Path, config_name: str, args: Sequence[str],
                                 keys: Sequence[str]) -> None:
    """Exit with one line (status 2), before Hydra starts, when a folder the composed settings name (``keys``, such
    as ``data.cache_dir``) cannot be written: the default's too, not only a value on the command line (a volume the
    container's user cannot write, say). Settings that do not compose here are left to Hydra to report.
    """
    from hydra import compose, initialize_config_dir

    overrides = [arg for arg in args if "=" in arg and not arg.startswith("-") and not arg.startswith("hydra")]
    try:
        with initialize_config_dir(config_dir=str(config_dir.absolute()), version_base="1.3"):
            cfg = compose(config_name, overrides=overrides)
        places = [(key, OmegaConf.select(cfg, key)) for key in keys]
    except Exception:  # noqa: BLE001  # an override Hydra refuses, or an interpolation only the job resolves
        return
    for key, value in places:
        if value is None:
            continue
        try:
            check_writable(str(value), key, folder=True)
        except PathNotWritable as error:
            fail(program, error)


def check_run_dir_or_exit(program: str, config_dir: Path, config_name: str, args: Sequence[str]) -> None:
    """Exit with one line (status 2), before Hydra makes it, when the run dir lies where no folder can be made: the
    pattern Hydra would use (``hydra.run.dir``, or ``hydra.sweep.dir`` with ``-m``, from the command line, an
    experiment or the config: ``outputs/${now:...}``) is checked up to its first interpolation.
    """
    from hydra import compose, initialize_config_dir

    key = "hydra.sweep.dir" if any(arg in ("-m", "--multirun") for arg in args) else "hydra.run.dir"
    # Only these can change the pattern's fixed part; the others (a sweep's a=1,2 among them) need not compose.
    overrides = [arg for arg in args if arg.lstrip("+").startswith(("experiment=", "hydra.", "hydra/"))]
    try:
        with initialize_config_dir(config_dir=str(config_dir.absolute()), version_base="1.3"):
            hydra_cfg = compose(config_name, overrides=overrides, return_hydra_config=True).hydra
    except Exception:  # noqa: BLE001  # an override Hydra refuses: it says so itself when it starts
        return
    pattern = str(OmegaConf.to_container(hydra_cfg, resolve=False)[key.split(".")[1]]["dir"])
    if pattern.startswith("${"):
        return  # made wherever an interpolation says: nothing fixed to check
    fixed = pattern.split("${")[0]
    folder = (fixed.rpartition("/")[0] or ".") if "${" in pattern else fixed
    try:
        check_writable(folder, key, folder=True)
    except PathNotWritable as error:
        reason = str(error).removeprefix(f"{key}={folder} ")
        fail(program, f"{key}={pattern} cannot be made: {folder} {reason} (pass {key}=DIR)")


class RunDirOwner(Callback):
    """A Hydra callback (``hydra.callbacks`` in configs/train.yaml) that notes, before Hydra makes the run dir, the
    folders it is about to make: a run refused before it starts takes them away again
    (``refused_run_leaves_no_folder``), and never a folder that was there, such as a resumed or an earlier run's.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:  # the same ${now:...} as Hydra's: resolvers' results are cached in the config
            run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir"))).absolute()
        except OmegaConfBaseException:
            return  # an interpolation only the job resolves: nothing will be taken away
        first_made = run_dir
        while not first_made.parent.exists():
            first_made = first_made.parent
        if not run_dir.exists():
            _MADE_RUN_DIRS[run_dir] = first_made


@contextmanager
def refused_run_leaves_no_folder(job_files: Collection[str]) -> Iterator[None]:
    """When the job inside the block exits with status 2 (a refused setting, corpus or checkpoint: ``fail``), take
    away the run dir Hydra made for it in this process, and the empty folders made above it, while the run dir holds
    nothing but ``job_files`` (``.hydra``, the job's log, ``.lock``): a later ``compare_runs.py outputs/*/`` must not
    trip over it.
    """
    try:
        yield
    except SystemExit as stop:
        if stop.code == 2:
            _remove_made_run_dir(set(job_files))
        raise


def _remove_made_run_dir(job_files: set[str]) -> None:
    from hydra.core.hydra_config import HydraConfig

    run_dir = Path(HydraConfig.get().runtime.output_dir).absolute()
    first_made = _MADE_RUN_DIRS.get(run_dir)
    if first_made is None or not {path.name for path in run_dir.iterdir()} <= job_files:
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for folder in run_dir.parents:  # nearest first, up to the first folder made
        if folder != first_made and first_made not in folder.parents:
            break
        try:
            folder.rmdir()
        except OSError:  # not empty: something else lives there now
            break


@contextmanager
def user_errors(program: str, errors: tuple[type[Exception], ...]) -> Iterator[None]:
    """Report ``errors`` (and ``PathNotWritable``) raised inside the block in one line and exit 2; anything else
    stays a traceback (a bug)."""
    try:
        yield
    except (*errors, PathNotWritable) as error:
        fail(program, error)


def same_command(program: str, args: Sequence[str] | None = None) -> str:
    """The command line that was run (``python PROGRAM ARGS``, quoted for a shell): what goes on after a stop."""
    return shlex.join(["python", program, *(sys.argv[1:] if args is None else args)])


def _dropping_disk_full(handle_error: Callable[[logging.LogRecord], None]) -> Callable[[logging.LogRecord], None]:
    """A log handler's ``handleError`` that drops a record which found no room and reports any other failure."""
    def handle(record: logging.LogRecord) -> None:
        if not is_disk_full(sys.exc_info()[1]):  # handleError runs inside the emit's except block
            handle_error(record)

    handle.dropping_disk_full = True  # type: ignore[attr-defined]  # wrapped once, however often the job starts
    return handle


def quiet_log_files_when_full() -> None:
    """Make the root logger's handlers (Hydra's ``train.log`` among them) drop a line the disk has no room for,
    instead of printing logging's "--- Logging error ---" traceback for each: the job's one disk-full line says
    what happened. Other logging failures are still reported.
    """
    for handler in logging.getLogger().handlers:
        if not getattr(handler.handleError, "dropping_disk_full", False):
            handler.handleError = _dropping_disk_full(handler.handleError)  # type: ignore[method-assign]


def hydra_saves_exit_when_full(program: str, kept: str, go_on: str) -> None:
    """Make a full disk while Hydra writes the run dir's ``.hydra/*.yaml`` (before the job starts, so outside
    ``disk_full_exits``) the one disk-full line and exit ``EXIT_WRITE_STOPPED``, not Hydra's traceback and exit 1.
    """
    from hydra.core import utils

    save = getattr(utils, "_save_config", None)  # Hydra's own writer, looked up by run_job as a module global
    if save is None or getattr(save, "exits_when_full", False):
        return  # another Hydra version: its own report stands

    def guarded(cfg: Any, filename: str, output_dir: Path) -> None:
        try:
            save(cfg, filename, output_dir)
        except OSError as error:
            if not is_disk_full(error):
                raise
            named = OSError(error.errno, error.strerror, str(Path(output_dir) / filename))
            fail(program, write_stopped_message(named, kept, go_on), EXIT_WRITE_STOPPED)

    guarded.exits_when_full = True  # type: ignore[attr-defined]
    utils._save_config = guarded


@contextmanager
def disk_full_exits(program: str, kept: str, go_on: str) -> Iterator[None]:
    """Report a write stopped inside the block in one line and exit ``EXIT_WRITE_STOPPED``: a ``WriteStopped`` as the
    job worded it, any other failed write (``is_write_error``) with ``kept`` (what is safe) and ``go_on`` (the command
    to rerun).
    Log lines that find the disk full inside the block are dropped (``quiet_log_files_when_full``).
    """
    quiet_log_files_when_full()
    try:
        yield
    except WriteStopped as error:
        fail(program, error, EXIT_WRITE_STOPPED)
    except OSError as error:
        if not is_write_error(error):
            raise
        fail(program, write_stopped_message(error, kept, go_on), EXIT_WRITE_STOPPED)
