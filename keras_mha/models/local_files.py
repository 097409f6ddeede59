"""Files of a local checkpoint folder, resolved and kept inside that folder.

A checkpoint folder names its files itself (`model.safetensors.index.json` names the
shards, `tokenizer.json` may be a symlink), and what keras-mha reads from it ends up in
the model and in any checkpoint `save_pretrained` writes from it. So every file is
resolved (symlinks followed) and must stay inside the folder: a shard named
`../../outside/x.safetensors`, an absolute path, or a symlink to a file elsewhere is
refused with a `CheckpointError` naming the file. The one exception is the Hugging Face
cache's own layout, where `snapshots/<commit>/<file>` is a symlink into the repository's
`blobs/` folder. Only regular files are read (never a FIFO or a device, which would block
or never end).

Example:
    >>> from keras_mha.models.local_files import file_in_folder
    >>> file_in_folder("path/to/checkpoint", "tokenizer.json")  # doctest: +SKIP
    PosixPath('/abs/path/to/checkpoint/tokenizer.json')
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from keras_mha.errors import CheckpointError
from keras_mha.planning.config_values import shown


def allowed_roots(folder: Path) -> list[Path]:
    """The folders a file of `folder` may resolve into: the folder itself and, for a
    snapshot of the HF cache (`<repo>/snapshots/<commit>`), the repository's `blobs/`.

    Example:
        >>> [p.name for p in allowed_roots(Path("/nonexistent/checkpoint"))]
        ['checkpoint']
    """
    resolved = Path(folder).resolve()
    roots = [resolved]
    repository = resolved.parent.parent
    if resolved.parent.name == "snapshots" and (repository / "blobs").is_dir():
        roots.append((repository / "blobs").resolve())
    return roots


def _is_inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def file_in_folder(folder, name: str, *, named_in: str | None = None) -> Path | None:
    """`folder / name` resolved, when it exists; None when it does not.

    Args:
        folder: the checkpoint folder.
        name: a path relative to it, as a checkpoint names its files.
        named_in: the file that named `name` (an index), for the messages.

    Raises:
        CheckpointError: `name` is absolute or goes through `..`, resolves outside the
            folder (a symlink leading elsewhere), or is not a regular file.

    Example:
        >>> file_in_folder("/nonexistent", "model.safetensors") is None
        True
    """
    folder = Path(folder)
    where = f"{named_in}: " if named_in else ""
    if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in Path(name).parts:
        raise CheckpointError(
            f"{where}file name {shown(name)} is not a path inside the checkpoint folder "
            f"{str(folder)!r} (absolute, or through '..'); keras-mha reads only files inside it",
            path=str(folder),
            value=name,
        )
    candidate = folder / name
    if not os.path.lexists(candidate):
        return None
    resolved = candidate.resolve()
    if not any(_is_inside(resolved, root) for root in allowed_roots(folder)):
        raise CheckpointError(
            f"{where}{str(candidate)!r} resolves to {str(resolved)!r}, outside the checkpoint "
            f"folder {str(folder)!r}; keras-mha reads only files inside it (copy the file in "
            "instead of linking to it)",
            path=str(candidate),
            value=str(resolved),
        )
    try:
        mode = os.stat(resolved).st_mode
    except OSError as error:  # A dangling symlink: it names a file that is not there.
        raise CheckpointError(
            f"{where}{str(candidate)!r} cannot be read ({error.strerror or error})",
            path=str(candidate),
        ) from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(
            f"{where}{str(candidate)!r} is not a regular file; expected a file of the checkpoint",
            path=str(candidate),
        )
    return resolved


__all__ = ["allowed_roots", "file_in_folder"]
