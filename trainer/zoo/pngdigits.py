"""scikit-learn's digits written out as PNG files: sample data for the image-folder loader.

The zoo's digits come from memory; this tree exercises the path a user's own images take (files on
disk, decoded by DataLoader workers), with images of a realistic size to decode.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SPLIT_SEED = 0  # the zoo's digits split uses the same permutation, so the held-out images agree
MARKER = ".complete"  # written last: its presence (with the same settings) means the tree is whole


def write_digits_pngs(root: str | os.PathLike, size: int = 32, val_share: float = 0.2) -> Path:
    """Write the 1,797 digits as ``root/train/<digit>/<i>.png`` and ``root/test/<digit>/<i>.png``
    (``i``: the digit's index in scikit-learn's order), upscaled bilinearly to ``size`` x ``size``
    grayscale. Returns ``root``.

    Idempotent: a tree already completed with the same settings is left alone; one completed with
    other settings is an error rather than silently mixed. Each file is written under a temporary
    name and renamed, so processes writing the same tree at once never leave a truncated image, and
    an interrupted run is finished (stale files removed) by the next.
    """
    import torch
    from PIL import Image

    from pipeboard.trainer.zoo.digits import digits_images

    if not 0 < val_share < 1:
        raise ValueError(f"val_share must be in (0, 1), got {val_share}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    root = Path(root)
    settings = {"size": size, "val_share": val_share}
    marker = root / MARKER
    if marker.is_file():
        found = json.loads(marker.read_text())
        if found == settings:
            return root
        raise ValueError(f"{root}: holds digits written with {found}, not {settings}; use another folder")

    images, labels = digits_images()
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(SPLIT_SEED))
    test = set(order[: int(len(images) * val_share)].tolist())
    pixels = (images * 255).round().to(torch.uint8).numpy()
    wanted = set()
    for i, (image, label) in enumerate(zip(pixels, labels.tolist())):
        folder = root / ("test" if i in test else "train") / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i}.png"
        wanted.add(path)
        tmp = folder / f".{i}.{os.getpid()}.tmp"
        Image.fromarray(image, mode="L").resize((size, size), Image.BILINEAR).save(tmp, format="PNG")
        os.replace(tmp, path)
    for split in ("train", "test"):  # files left by an interrupted run with other settings
        for stale in (root / split).glob("*/*.png"):
            if stale not in wanted:
                stale.unlink(missing_ok=True)
    tmp = root / f".{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(settings))
    os.replace(tmp, marker)
    return root
