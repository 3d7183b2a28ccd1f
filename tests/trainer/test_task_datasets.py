"""Users' local files as task data: text windows from .txt/.parquet/.jsonl, and an image folder
(scikit-learn's digits written as PNGs) decoded per item, also in DataLoader workers."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeboard.trainer.task.datasets import image_folder, text_windows
from pipeboard.trainer.zoo.pngdigits import write_digits_pngs

TEXT = "".join(f"Line {i}: the quick brown fox — naïve café {i * i}\n" for i in range(60))
SEQ = 16


def _items(data) -> list[tuple[list[int], list[int]]]:
    return [(x.tolist(), y.tolist()) for x, y in (data[i] for i in range(len(data)))]


def _write_parquet(path: Path, column: str, docs: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({column: docs, "id": list(range(len(docs)))}), path)
    return path


@pytest.fixture(scope="module")
def text_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text")
    (root / "corpus.txt").write_text(TEXT, encoding="utf-8")
    _write_parquet(root / "corpus.parquet", "text", [TEXT])
    (root / "corpus.jsonl").write_text(json.dumps({"text": TEXT, "id": 0}) + "\n", encoding="utf-8")
    return {"txt": root / "corpus.txt", "parquet": root / "corpus.parquet", "jsonl": root / "corpus.jsonl"}


# ---- text ---------------------------------------------------------------------------------------
def test_txt_parquet_and_jsonl_give_the_same_windows(text_files):
    loaded = {kind: text_windows(path, SEQ) for kind, path in text_files.items()}
    train, val = loaded["txt"]
    n = (len(TEXT.encode()) - 1) // SEQ
    assert (len(train), len(val)) == (n - n // 10, n // 10)
    for kind in ("parquet", "jsonl"):
        assert _items(loaded[kind][0]) == _items(train), kind
        assert _items(loaded[kind][1]) == _items(val), kind
    assert train.vocab_size == val.vocab_size == 256


def test_windows_are_the_text_bytes_with_targets_shifted_by_one(text_files):
    train, val = text_windows(text_files["txt"], SEQ)
    x, y = train[0]
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (SEQ,)
    starts = sorted([(int(s), d, i) for d in (train, val) for i, s in enumerate(d.starts)])
    assert [s for s, _, _ in starts] == [i * SEQ for i in range(len(starts))]  # every window, in order
    assert set(int(s) // SEQ % 10 for s in val.starts) == {9}  # every 10th is held out, fixed
    tokens: list[int] = []
    last = None
    for _, data, i in starts:
        x, y = data[i]
        assert torch.equal(x[1:], y[:-1])
        assert last in (None, x[0].item())  # windows overlap by one: each token is a target once
        tokens += x.tolist()
        last = y[-1].item()
    tokens.append(last)
    assert bytes(tokens).decode("utf-8") == TEXT.encode()[: len(tokens)].decode("utf-8")


def test_a_folder_of_documents_joins_them_with_a_newline(tmp_path, text_files):
    folder = tmp_path / "docs"
    folder.mkdir()
    halves = [TEXT[:1000], TEXT[1000:]]
    for i, half in enumerate(halves):
        (folder / f"part{i}.txt").write_text(half, encoding="utf-8")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": h}) + "\n" for h in halves), encoding="utf-8")
    from_folder, from_rows = text_windows(folder, SEQ, val_share=0), text_windows(rows, SEQ, val_share=0)
    assert from_folder[1] is None and from_rows[1] is None
    assert _items(from_folder[0]) == _items(from_rows[0])
    joined = "\n".join(halves).encode()
    windows = from_folder[0]
    tokens = [t for i in range(len(windows)) for t in windows[i][0].tolist()] + [windows[-1][1][-1].item()]
    assert bytes(tokens) == joined[: len(tokens)] and len(tokens) > len(halves[0].encode())


def test_a_custom_tokenizer_is_used(text_files):
    train, val = text_windows(text_files["jsonl"], 8, tokenizer=lambda s: [ord(c) for c in s], val_share=0.25)
    codes = [ord(c) for c in TEXT]
    assert train.vocab_size == max(codes) + 1 > 256
    assert train[0][0].tolist() == codes[:8] and train[0][1].tolist() == codes[1:9]
    assert len(train) + len(val) == (len(codes) - 1) // 8

    class Encoder:  # the shape of a transformers tokenizer: encode() and a vocabulary length
        def __init__(self):
            self.calls = []

        def encode(self, text, add_special_tokens=True):
            self.calls.append(add_special_tokens)
            return [len(word) for word in text.split()]

        def __len__(self):
            return 1000

        def __call__(self, text):
            raise AssertionError("a tokenizer with encode() is called through encode()")

    encoder = Encoder()
    train, _ = text_windows(text_files["txt"], 4, tokenizer=encoder, val_share=0.5)
    assert encoder.calls == [False] and train.vocab_size == 1000
    assert train[0][0].tolist() == [len(w) for w in TEXT.split()[:4]]


def test_text_errors_name_the_path_and_column(tmp_path, text_files):
    with pytest.raises(ValueError, match="no-such.txt: no such file"):
        text_windows(tmp_path / "no-such.txt", SEQ)
    (tmp_path / "table.csv").write_text("text\nhello\n")
    with pytest.raises(ValueError, match=r"table.csv: unknown extension"):
        text_windows(tmp_path / "table.csv", SEQ)
    body = _write_parquet(tmp_path / "body.parquet", "body", [TEXT])
    with pytest.raises(ValueError, match=r"body.parquet: no column 'text' \(columns: body, id\)"):
        text_windows(body, SEQ)
    assert len(text_windows(body, SEQ, text_column="body")[0]) > 0
    short = tmp_path / "short.txt"
    short.write_text("too short")
    with pytest.raises(ValueError, match=r"short.txt: 9 tokens, shorter than one window"):
        text_windows(short, SEQ)
    with pytest.raises(ValueError, match="short.txt: 2 window.* too few to hold out"):
        text_windows(short, 4)  # two windows: every 10th leaves no validation window


# ---- images -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits_root(tmp_path_factory) -> Path:
    return write_digits_pngs(tmp_path_factory.mktemp("pngdigits"))


@pytest.fixture(scope="module")
def digits(digits_root):
    return image_folder(digits_root)


def test_the_png_tree_is_complete_and_written_once(digits_root):
    files = {split: sorted((digits_root / split).glob("*/*.png")) for split in ("train", "test")}
    assert (len(files["train"]), len(files["test"])) == (1797 - 359, 359)
    assert not {p.name for p in files["train"]} & {p.name for p in files["test"]}
    before = files["train"][0].stat().st_mtime_ns
    assert write_digits_pngs(digits_root) == digits_root  # complete: skipped
    assert files["train"][0].stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="not {'size': 16"):
        write_digits_pngs(digits_root, size=16)


def test_split_sizes_and_labels_follow_the_folders(digits_root, digits):
    from pipeboard.trainer.zoo.digits import digits_images

    train, val = digits
    assert (len(train), len(val)) == (1797 - 359, 359)
    assert train.classes == val.classes == [str(d) for d in range(10)]
    source_labels = digits_images()[1]
    for data, split in ((train, "train"), (val, "test")):
        assert set(data.labels.tolist()) == set(range(10))
        for file, label in zip(data.files, data.labels.tolist()):
            path = Path(file)
            assert path.parent.parent == digits_root / split
            assert path.parent.name == data.classes[label] == str(source_labels[int(path.stem)].item())


def test_items_are_the_source_digits_upsampled(digits):
    from pipeboard.trainer.zoo.digits import digits_images

    images, labels = digits_images()
    train, val = digits
    for data in (train, val):
        for i in range(0, len(data), 37):
            x, y = data[i]
            assert x.shape == (1, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
            assert 0 <= x.min() and x.max() <= 1
            k = int(Path(data.files[i]).stem)
            expected = F.interpolate(images[k][None, None], size=32, mode="bilinear", align_corners=False)[0]
            assert (x - expected).abs().max() < 0.01  # PIL's bilinear, quantised to 8 bits
            assert y.item() == labels[k].item()


def test_the_data_set_pickles_and_loads_in_forked_workers(digits):
    _, val = digits
    again = pickle.loads(pickle.dumps(val))
    assert again.classes == val.classes and torch.equal(again[5][0], val[5][0])
    loader = torch.utils.data.DataLoader(val, batch_size=64, num_workers=2, multiprocessing_context="fork")
    xs, ys = zip(*loader)
    assert torch.equal(torch.cat(ys), val.labels)
    assert torch.equal(torch.cat(xs), torch.stack([val[i][0] for i in range(len(val))]))


def test_channels_size_and_normalisation(digits_root):
    from PIL import Image

    train, _ = image_folder(digits_root, size=(16, 20), channels=3, mean=0.5, std=[0.5, 0.25, 0.5])
    x, _ = train[3]
    assert x.shape == (3, 16, 20)
    gray = Image.open(train.files[3]).resize((20, 16), Image.BILINEAR)  # PIL sizes are (w, h)
    expected = torch.from_numpy(np.asarray(gray, dtype=np.float32)) / 255
    assert torch.allclose(x[0], (expected - 0.5) / 0.5, atol=1e-6)
    assert torch.equal(x[0], x[2]) and torch.allclose(x[1], 2 * x[0], atol=1e-6)  # gray, as RGB
    with pytest.raises(ValueError, match="mean: 2 values for 3 channel"):
        image_folder(digits_root, channels=3, mean=[0.5, 0.5])


def test_image_errors_name_the_path(tmp_path, digits_root):
    with pytest.raises(ValueError, match="missing: no such folder"):
        image_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: no images found"):
        image_folder(tmp_path / "empty")
    bad = tmp_path / "bad"
    for label in ("a", "b"):
        (bad / label).mkdir(parents=True)
        (bad / label / "ok.png").write_bytes((digits_root / "train" / "0" / "0.png").read_bytes())
    (bad / "b" / "broken.png").write_bytes(b"not a png")
    train, val = image_folder(bad, val_share=0)
    assert val is None and train.classes == ["a", "b"] and len(train) == 3
    for i, file in enumerate(train.files):
        if Path(file).name == "broken.png":
            with pytest.raises(ValueError, match=r"bad/b/broken.png: unreadable image"):
                train[i]
        else:
            assert train[i][0].shape == (1, 32, 32)


def test_huggingface_libraries_are_kept_offline(text_files):
    import datasets

    text_windows(text_files["txt"], SEQ)
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"
    assert datasets.config.HF_HUB_OFFLINE is True
