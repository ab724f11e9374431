"""Reading and writing the project's files with one-line errors: a file that cannot be read
(missing, unreadable, not text) or written (no such folder, read-only, a file where a folder
should be) is a SpecError naming it, never a traceback. Writes are atomic (temp file in the
same folder + os.replace), so a failed write leaves the old file whole."""
from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

from .errors import SpecError

# The one prefix of the temporary files a write makes beside its target (atomic_write_bytes) and the
# probe makes up front (_probe): short and fixed, so that any name that fits the file system's 255-byte
# NAME_MAX has a temp file that fits too (a ".{name}." prefix failed on names of 246-255 bytes only at
# the write, after the work), and the probe tries exactly what the write will do.
_TMP_PREFIX = ".piper-"


def read_text(path: str | os.PathLike, source: str | None = None) -> str:
    """The file's text (UTF-8, a byte-order mark dropped as editors on Windows write one); a
    missing, unreadable or binary file is a SpecError."""
    src = source or str(path)
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as e:
        raise SpecError(src, "<file>", f"cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise SpecError(src, "<file>", f"expected UTF-8 text (byte {e.start} is not)") from None


def parse_json(text: str, source: str, object_pairs_hook=None):
    """json.loads with a one-line SpecError for what it raises beside malformed text: an integer
    past Python's 4,300 digits (ValueError) and nesting past the recursion limit."""
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as e:
        raise SpecError(source, f"line {e.lineno}", f"malformed JSON ({e.msg})") from None
    except ValueError:  # an integer past sys.get_int_max_str_digits()
        raise SpecError(source, "<json>", f"a number of more than {sys.get_int_max_str_digits():,} digits") from None
    except RecursionError:
        raise SpecError(source, "<json>", "nested too deep") from None


def check_writable(path: str | os.PathLike, what: str = "<file>", make_parents: bool = False) -> None:
    """Fail before any work where `path` cannot be written: its folder must exist (or, with
    make_parents, be creatable under the nearest folder that does), be a folder and be writable,
    and the path itself must not be a folder. Checked up front so a long run (a calibration, a
    training run) does not end by losing its result. A symlink is checked where the write lands,
    at the file it names (atomic_write_bytes): a dangling one into a missing folder fails here.
    A name the file system cannot hold (longer than NAME_MAX, 255 bytes) is a SpecError too."""
    p = Path(path)
    try:
        if p.is_dir():
            raise SpecError(str(p), what, "cannot write: it is a folder")
        if _special(p):  # a device or a FIFO (/dev/stdout into a pipe): written into, no temp file beside it
            if not os.access(p, os.W_OK):
                raise SpecError(str(p), what, "cannot write: not writable")
            return
        folder = p.parent
        if p.is_symlink():  # the write follows the link; nothing makes the folders of its target
            folder, make_parents = Path(os.path.realpath(p)).parent, False
        _check_folder(p, folder, what, make_parents)
        if folder.is_dir():  # the write makes its temporary file there (atomic_write_bytes): make one now
            _probe(p, folder, what)
    except OSError as e:  # ENAMETOOLONG, ELOOP, EACCES on a folder above: what stat() says, on one line
        raise SpecError(str(p), what, f"cannot write ({e.strerror or e})") from None


def check_outputs(outputs, inputs=(), make_parents: bool = False) -> None:
    """check_writable for each (path, option) of `outputs` given (None: not asked for), after the
    slips that would lose a file: an empty name or one ending in a separator (a folder meant: the
    write made a file of that name), two outputs on one file (the second replaced the first), and
    an output on one of the run's `inputs` (a plan written over its own model spec)."""
    given = [(str(p), w) for p, w in outputs if p is not None]
    seen: dict = {}
    for p, what in given:
        if not p.strip() or p.endswith(("/", os.sep)):
            raise SpecError(repr(p), what, "expected a file name (not empty, not a folder)")
        key = os.path.realpath(p)
        if key in seen:
            raise SpecError(p, what, f"is {seen[key]}'s file too: give each output its own")
        seen[key] = what
        for q, src in inputs:  # (a bundled spec's name is no file here, and an output not yet made no input)
            if q is not None and os.path.exists(p) and os.path.exists(str(q)) and os.path.samefile(p, str(q)):
                raise SpecError(p, what, f"is the {src} this run reads: writing it would replace it")
        check_writable(p, what, make_parents)


def check_writable_folder(path: str | os.PathLike, what: str) -> None:
    """As check_writable, for a folder a run writes into: made, with its parents, where missing,
    and a file written into it and removed (_probe)."""
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            raise SpecError(str(p), what, "expected a folder; this is a file")
        _check_folder(p, p, what, make_parents=True)
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # ENAMETOOLONG from stat() as much as a mkdir refused
        raise SpecError(str(p), what, f"cannot write: {e.strerror or e}") from None
    _probe(p, p, what)


def _probe(p: Path, folder: Path, what: str) -> None:
    """Write a file into `folder` and remove it: permission bits do not stop root where the file
    system refuses (/proc, a read-only mount)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=_TMP_PREFIX):
            pass
    except OSError as e:
        raise SpecError(str(p), what, f"cannot write: {e.strerror or e}") from None


def _check_folder(p: Path, folder: Path, what: str, make_parents: bool) -> None:
    """`folder` (or, with make_parents, the nearest of its ancestors that exists) is a writable folder."""
    if make_parents:
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
    if not folder.exists():
        raise SpecError(str(p), what, f"cannot write: no folder {str(folder)!r}")
    if not folder.is_dir():
        raise SpecError(str(p), what, f"cannot write: {str(folder)!r} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError(str(p), what, f"cannot write: folder {str(folder)!r} is not writable")


def atomic_write_text(path: str | os.PathLike, text: str, what: str = "<file>") -> None:
    atomic_write_bytes(path, text.encode(), what)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, what: str = "<file>") -> None:
    """Write via a temp file in the same folder and os.replace: a failed write leaves the old file whole
    and is a one-line SpecError. The file keeps the mode of the one it replaces, else gets what open()
    would give it (0666 less the umask; mkstemp's own 0600 would hide a plan or spec from the other
    users of a machine). `what`: the option that named the file, for the error."""
    p = Path(os.path.realpath(path))  # through a symlink to the file it names (not over the link)
    try:
        special = _special(Path(path))  # a device or a FIFO (/dev/stdout)
    except OSError as e:  # a name too long: check_writable says so up front, this where it was skipped
        raise SpecError(str(path), what, f"cannot write ({e.strerror or e})") from None
    if special:  # write into it, by the name given: /dev/stdout's link into /proc names a pipe no path reaches
        try:
            with open(path, "wb") as f:
                f.write(data)
            return
        except OSError as e:
            raise SpecError(str(path), what, f"cannot write ({e.strerror or e})") from None
    try:
        mode = p.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=p.parent)
    except OSError as e:
        raise SpecError(str(path), what, f"cannot write ({e.strerror or e})") from None
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise SpecError(str(path), what, f"cannot write ({e.strerror or e})") from None
        raise


def is_stdout(path: str | os.PathLike | None) -> bool:
    """Whether writing `path` writes this process's standard output (/dev/stdout, /dev/fd/1, or
    the file or pipe stdout is): where data goes there, tables go to stderr."""
    if not path:
        return False
    try:
        a, b = os.stat(path), os.fstat(1)
    except (OSError, ValueError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _special(p: Path) -> bool:
    """Whether `p` is, through its links, neither a regular file nor a folder: a device or a FIFO.
    stat() of the name itself, not of its realpath: /dev/stdout's link resolves to "pipe:[N]" in
    /proc, which no path reaches, while the kernel follows the link itself to the pipe."""
    try:
        mode = os.stat(p).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet (a file where a folder must be:
        return False  # check_writable says so)
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def image_format(path: str | os.PathLike, what: str = "--plot") -> str:
    """The image format a plot is written in, from its file's suffix (png where it has none): one
    matplotlib writes, else a one-line SpecError listing those it does."""
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lower().lstrip(".")
    if not suffix:
        return "png"
    if suffix not in kinds:
        raise SpecError(str(path), what, f"expected a suffix matplotlib writes ({', '.join(sorted(kinds))}); "
                        f"got .{suffix}")
    return suffix
