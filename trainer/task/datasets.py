"""Users' local files as task data: text for language models, an image folder for classifiers.

Files are parsed with Hugging Face ``datasets`` (its builders know the formats and the imagefolder
layout), but the torch ``Dataset``s returned hold only plain arrays and paths: they pickle small,
so DataLoader workers (forked or spawned) start fast, and images are decoded there, per item.

Nothing is downloaded: Hugging Face libraries are put in offline mode before ``datasets`` is
imported (and again after, in case it already was), so not even a metadata request is tried.

Caching: ``load_dataset`` always writes Arrow files under its cache dir and takes file locks there
(``keep_in_memory`` only decides whether the result is then read back into memory). Two pipeline
stages load the same files at once; sharing ``~/.cache/huggingface`` between them means waiting on
each other's locks, and a stage killed mid-write leaves a half-built cache behind. Each call
therefore builds into its own temporary directory, reads the result into memory and deletes it:
the parse is redone per process (cheap: images are stored as paths, not pixels) and nothing is
written to the user's home.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

TEXT_BUILDERS = {".txt": "text", ".parquet": "parquet", ".json": "json", ".jsonl": "json"}
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")


def _datasets():
    """``datasets``, offline. Imported here: it takes about a second, which no caller of this
    module's import should pay."""
    for name in OFFLINE_VARIABLES:
        os.environ[name] = "1"
    import datasets
    import huggingface_hub.constants

    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()  # one bar per split and stage would bury the run's own output
    return datasets


def _load(builder: str, split: str | None = None, **kwargs):
    """``load_dataset`` built in a private, temporary cache (see the module's docstring)."""
    datasets = _datasets()
    with tempfile.TemporaryDirectory(prefix="pipeboard-hf-") as cache:
        return datasets.load_dataset(builder, split=split, cache_dir=cache, keep_in_memory=True, **kwargs)


def _holdout(n: int, share: float) -> np.ndarray:
    """Which of ``n`` items are held out: evenly spread (every 10th for 0.1), fixed by the index
    alone, so the validation items never depend on a seed."""
    i = np.arange(n)
    return np.floor((i + 1) * share) > np.floor(i * share)


def _check_share(share: float) -> None:
    if not 0 <= share < 1:
        raise ValueError(f"val_share must be in [0, 1), got {share}")


# ---- text ---------------------------------------------------------------------------------------
class TextWindows(Dataset):
    """Windows of ``seq_len + 1`` tokens starting at ``starts``: ``(ids[:-1], ids[1:])``, int64."""

    def __init__(self, tokens: np.ndarray, starts: np.ndarray, seq_len: int, vocab_size: int):
        self.tokens, self.starts, self.seq_len, self.vocab_size = tokens, starts, seq_len, vocab_size

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(self.starts[index])
        ids = torch.from_numpy(self.tokens[start : start + self.seq_len + 1].astype(np.int64))
        return ids[:-1], ids[1:]

    def target(self, index: int) -> torch.Tensor:
        start = int(self.starts[index])
        return torch.from_numpy(self.tokens[start + 1 : start + self.seq_len + 1].astype(np.int64))


def _text_files(path: Path) -> tuple[str, list[str]]:
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder")
    files = [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*")
                       if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
    kinds = {TEXT_BUILDERS.get(p.suffix.lower()) for p in files}
    if None in kinds or len(kinds) != 1:
        odd = [p.name for p in files if p.suffix.lower() not in TEXT_BUILDERS][:3]
        why = f"unknown extension ({', '.join(odd)})" if odd else "no text files" if not files else "mixed formats"
        raise ValueError(f"{path}: {why}; expected .txt, .parquet, .json or .jsonl files of one kind")
    return kinds.pop(), [str(p) for p in files]


def _tokenize(text: str, tokenizer) -> tuple[np.ndarray, int]:
    if tokenizer is None:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8), 256
    if hasattr(tokenizer, "encode"):  # a transformers tokenizer: its __call__ returns a dict
        ids, vocab = tokenizer.encode(text, add_special_tokens=False), len(tokenizer)
    else:
        ids, vocab = tokenizer(text), None
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or (len(ids) and ids.min() < 0):
        raise ValueError("tokenizer: expected a flat list of non-negative token ids")
    vocab = vocab or (int(ids.max()) + 1 if len(ids) else 0)
    return (ids.astype(np.int32) if vocab < 2**31 else ids), vocab


def text_windows(path: str | os.PathLike, seq_len: int, *, tokenizer: Callable[[str], list[int]] | Any = None,
                 val_share: float = 0.1, text_column: str = "text") -> tuple[TextWindows, TextWindows | None]:
    """A language-modelling data set from a ``.txt``, ``.parquet``, ``.json``/``.jsonl`` file or a
    folder of files of one of those kinds. Each ``.txt`` file is one document; in the others each
    row's ``text_column`` is. Documents are joined by a newline and tokenised as one text (UTF-8
    bytes by default, vocabulary 256; else ``tokenizer``: a callable ``str -> list[int]`` or an
    object with ``encode``, such as a transformers tokenizer, used without special tokens).

    The text is cut into windows of ``seq_len + 1`` tokens overlapping by one, so every token
    (but the first, and a tail shorter than ``seq_len``) is a target exactly once. Every ``1/val_share``-th window is held out (``val`` is None for a
    share of 0). Both data sets carry ``vocab_size``.
    """
    _check_share(val_share)
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    path = Path(path)
    builder, files = _text_files(path)
    options = {"sample_by": "document", "keep_linebreaks": True} if builder == "text" else {}
    table = _load(builder, split="train", data_files=files, **options)
    if text_column not in table.column_names:
        raise ValueError(f"{path}: no column {text_column!r} (columns: {', '.join(table.column_names)})")
    docs = table[text_column]
    if not all(isinstance(doc, str) for doc in docs):
        raise ValueError(f"{path}: column {text_column!r} does not hold text in every row")
    return _windows("\n".join(docs), seq_len, tokenizer, val_share, str(path))


def text_windows_of(text: str, seq_len: int, *, tokenizer: Callable[[str], list[int]] | Any = None,
                    val_share: float = 0.1) -> tuple[TextWindows, TextWindows | None]:
    """:func:`text_windows` of a text already in memory (a corpus a task ships, say)."""
    _check_share(val_share)
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    return _windows(text, seq_len, tokenizer, val_share, "text")


def _windows(text: str, seq_len: int, tokenizer, val_share: float, where: str):
    tokens, vocab = _tokenize(text, tokenizer)
    n = (len(tokens) - 1) // seq_len
    if n < 1:
        raise ValueError(f"{where}: {len(tokens)} tokens, shorter than one window of seq_len + 1 = {seq_len + 1}")
    starts, is_val = np.arange(n) * seq_len, _holdout(n, val_share)
    if val_share and (is_val.all() or not is_val.any()):
        raise ValueError(f"{where}: {n} window(s) of {seq_len + 1} tokens, too few to hold out {val_share:.0%}")
    train = TextWindows(tokens, starts[~is_val], seq_len, vocab)
    return train, (TextWindows(tokens, starts[is_val], seq_len, vocab) if val_share else None)


# ---- images -------------------------------------------------------------------------------------
class ImageFiles(Dataset):
    """Images decoded on access: ``(float32 [C, H, W], int64 label)``. ``files`` holds paths (or
    encoded bytes); ``classes`` the label names."""

    def __init__(self, files: list, labels: np.ndarray, classes: list[str], mode: str,
                 size: tuple[int, int] | None, scale: np.ndarray, shift: np.ndarray):
        self.files, self.labels, self.classes = files, torch.as_tensor(labels, dtype=torch.int64), classes
        self.mode, self.size, self.scale, self.shift = mode, size, scale, shift

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        source = self.files[index]
        try:
            with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
                image = image.convert(self.mode) if image.mode != self.mode else image
                if self.size is not None and image.size != self.size[::-1]:
                    image = image.resize(self.size[::-1], Image.BILINEAR)  # PIL sizes are (w, h)
                pixels = np.asarray(image)
        except (OSError, ValueError) as exc:  # PIL's UnidentifiedImageError is an OSError
            where = source if isinstance(source, str) else f"image {index} (embedded bytes)"
            raise ValueError(f"{where}: unreadable image ({exc})") from exc
        pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
        # One pass: [0, 255] -> [0, 1] -> (x - mean) / std folded into x * scale + shift (float32).
        x = torch.from_numpy(np.ascontiguousarray(pixels * self.scale + self.shift))
        return x, self.labels[index]

    def target(self, index: int) -> torch.Tensor:
        """Item ``index``'s label without decoding its image (the last stage reads only this)."""
        return self.labels[index]


def _per_channel(value, channels: int, name: str, default: float) -> np.ndarray:
    v = np.asarray(default if value is None else value, dtype=np.float32).reshape(-1)
    if v.size == 1:
        v = np.repeat(v, channels)
    if v.size != channels:
        raise ValueError(f"{name}: {v.size} values for {channels} channel(s)")
    return v.reshape(channels, 1, 1)


def image_folder(path: str | os.PathLike, *, size: int | Sequence[int] | None = None, channels: int | None = None,
                 mean: float | Sequence[float] | None = None, std: float | Sequence[float] | None = None,
                 val_share: float = 0.2) -> tuple[ImageFiles, ImageFiles | None]:
    """A classification data set from an image folder: ``path/<label>/<image>`` or, split,
    ``path/train/<label>/...`` with ``path/validation/...`` (or ``test``). Labels index the sorted
    folder names (``.classes``). Without a split folder every ``1/val_share``-th image is held out.

    Images become ``channels`` (1: grayscale, 3: RGB; default that of the first image), are resized
    bilinearly to ``size`` (an int or ``(h, w)``; default: as stored, which must then agree for
    batching), scaled to [0, 1] and, given ``mean``/``std`` (one value or one per channel),
    normalised. Decoding waits for ``__getitem__``, that is for the DataLoader's workers; an
    unreadable image is reported there, with its path.
    """
    from PIL import Image

    _check_share(val_share)
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: no such folder")
    try:
        splits = _load("imagefolder", data_dir=str(path))
    except (FileNotFoundError, ValueError) as exc:  # no data files: the builder's own wording varies
        raise ValueError(f"{path}: no images found ({exc})") from exc
    if "train" not in splits:
        raise ValueError(f"{path}: no training images (found splits: {', '.join(splits)})")
    held = next((s for s in ("validation", "valid", "val", "test") if s in splits), None)
    if "label" not in splits["train"].column_names:
        raise ValueError(f"{path}: images must sit in one folder per class, as path/<label>/<image>")
    classes = list(splits["train"].features["label"].names)
    datasets = _datasets()

    def columns(split):
        table = splits[split].cast_column("image", datasets.Image(decode=False))
        files = [image["path"] if image["bytes"] is None else image["bytes"] for image in table["image"]]
        return files, np.asarray(table["label"], dtype=np.int64)

    files, labels = columns("train")
    if held is not None:
        (val_files, val_labels), is_val = columns(held), None
    else:
        is_val = _holdout(len(files), val_share)
        if val_share and (is_val.all() or not is_val.any()):
            raise ValueError(f"{path}: {len(files)} image(s), too few to hold out {val_share:.0%}")
    if channels is None:
        try:
            with Image.open(files[0] if isinstance(files[0], str) else io.BytesIO(files[0])) as first:
                channels = 1 if first.mode in ("1", "L", "LA", "I", "I;16", "F") else 3
        except OSError as exc:
            raise ValueError(f"{files[0] if isinstance(files[0], str) else path}: unreadable image ({exc})") from exc
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if size is not None:
        size = (int(size), int(size)) if isinstance(size, (int, np.integer)) else tuple(int(s) for s in size)
        if len(size) != 2 or min(size) < 1:
            raise ValueError(f"size must be an int or (height, width), got {size}")
    std_ = _per_channel(std, channels, "std", 1.0)
    scale, shift = 1 / (255 * std_), -_per_channel(mean, channels, "mean", 0.0) / std_
    make = lambda f, y: ImageFiles(f, y, classes, "L" if channels == 1 else "RGB", size, scale, shift)  # noqa: E731
    if is_val is None:
        return make(files, labels), make(val_files, val_labels)
    train = make([f for f, v in zip(files, is_val) if not v], labels[~is_val])
    return train, (make([f for f, v in zip(files, is_val) if v], labels[is_val]) if val_share else None)
