"""Image decoding and preprocessing shared by the data loaders, the CLI and the app.

Every image becomes a float tensor (3, S, S) normalised with open_clip's OpenAI CLIP mean/std: decoded to 8-bit
RGB (:func:`open_image`, :func:`to_rgb`; transparent pixels become the CLIP mean colour, which normalises to zero, so
their hidden colour never reaches the model), its shorter side resized to S (bicubic) and centre-cropped; or, for
training on real data with ``augment="rrc"``, randomly resized and cropped (:class:`SeededRandomResizedCrop`).
"""

from __future__ import annotations

import io
import math
import os
import random
import re
import stat
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from mdc_core.tokenizer import open_clip_module

MAX_SIDE = 10_000  # pixels: larger images are refused
MAX_PIXELS = 50_000_000  # 50 MP: larger images are refused (PIL's own bomb guard triggers only above ~179 MP)
MAX_ASPECT = 32  # long side / short side: resizing the short side to S makes S x 32 S pixels at most (a 1x10000
# PNG of 121 bytes would be resized to 224 x 2,240,000 pixels, 2.8 GB, before the centre crop)
MAX_FILE_BYTES = 256 * 2**20  # an image file larger than this is refused before it is read
RRC_SCALE = (0.9, 1.0)  # area fraction kept by the random resized crop (open_clip's default)
RRC_RATIO = (3 / 4, 4 / 3)  # aspect ratios of the random resized crop
_CLIP = open_clip_module("constants")  # CLIP's normalisation
OPENAI_DATASET_MEAN: tuple[float, float, float] = _CLIP.OPENAI_DATASET_MEAN
OPENAI_DATASET_STD: tuple[float, float, float] = _CLIP.OPENAI_DATASET_STD
BACKGROUND = tuple(round(255 * m) for m in OPENAI_DATASET_MEAN)  # what transparent pixels become: mean colour
_ADDRESS = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")  # "<_io.BytesIO object at 0x7f...>" in PIL's messages
_PIXELS = re.compile(r"\((\d+) pixels\)")  # "Image size (400000000 pixels) exceeds limit of ..." (PIL)
LIMITS = f"limit {MAX_SIDE} px per side, {MAX_PIXELS // 1_000_000} MP"


class ImageError(ValueError):
    """An image could not be used: `reason` is one of ``bad_image``, ``too_large``."""

    def __init__(self, message: str, reason: str = "bad_image"):
        super().__init__(message)
        self.reason = reason


def read_image_file(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the image file at `path`, read only when it is a regular file of at most `max_bytes`: a path to
    a device (``/dev/zero``), a FIFO (which would block until a writer comes), a socket or a folder is an
    :class:`ImageError` naming it, and so is a larger file. FileNotFoundError when it does not exist; other
    OSErrors (a permission) as raised. The file is opened without blocking and checked through its descriptor."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else
                    "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else
                    "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise ImageError(f"{path}: {kind}, not an image file (only regular files are read)")
        if info.st_size > max_bytes:
            raise ImageError(f"{path}: file of {info.st_size / 2**20:.0f} MB is too large for an image (limit "
                             f"{max_bytes // 2**20} MB)", "too_large")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew while being read
        raise ImageError(f"{path}: file is too large for an image (limit {max_bytes // 2**20} MB)", "too_large")
    return data


def open_image(data: bytes, name: str = "image") -> Image.Image:
    """Decode `data` into a fully loaded RGB PIL image; raise :class:`ImageError` naming `name` when the bytes
    are empty, not an image, truncated, or larger than :data:`MAX_SIDE` / :data:`MAX_PIXELS`."""
    if not data:
        raise ImageError(f"{name}: empty file (0 bytes), expected an image")
    try:
        with warnings.catch_warnings():
            # PIL warns above ~89 MP (and raises above ~179 MP) when it reads the header; our limits are lower and
            # say so in our words, so the warning is ignored here and the size checked below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
        w, h = img.size  # read from the header: nothing decoded yet
        if w > MAX_SIDE or h > MAX_SIDE or w * h > MAX_PIXELS:
            raise ImageError(f"{name}: image of {w}x{h} pixels is too large ({LIMITS})", "too_large")
        if max(w, h) > MAX_ASPECT * max(1, min(w, h)):  # resized to S on its short side: S x S * aspect pixels
            raise ImageError(f"{name}: image of {w}x{h} pixels is too elongated to resize (at most {MAX_ASPECT}:1)",
                             "too_large")
        img.load()  # decode now: truncated or corrupt data fails here, not inside a transform
    except ImageError:
        raise
    except Image.DecompressionBombError as err:  # PIL's header check above ~179 MP: the size is in its message
        pixels = _PIXELS.search(str(err))
        size = f"of {int(pixels.group(1)) / 1e6:.0f} MP " if pixels else ""
        raise ImageError(f"{name}: image {size}is too large ({LIMITS})", "too_large") from err
    except Exception as err:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ValueError ...
        if isinstance(err, Image.UnidentifiedImageError):  # PIL names the BytesIO it read: name the file
            raise ImageError(f"{name}: not a readable image (cannot identify image file {name})") from err
        detail = _ADDRESS.sub("the data", str(err))
        raise ImageError(f"{name}: not a readable image ({type(err).__name__}: {detail})") from err
    try:
        return to_rgb(img)
    except Exception as err:  # a mode PIL cannot convert
        raise ImageError(f"{name}: cannot convert image mode {img.mode!r} to RGB ({type(err).__name__})") from err


def to_rgb(img: Image.Image) -> Image.Image:
    """An 8-bit RGB image as a viewer shows `img`: EXIF orientation applied; 16-bit (``I;16*``), 32-bit integer
    (``I``) and float (``F``) grayscale scaled to 0-255 (``I`` as 16-bit when its values exceed 255, ``F`` as
    0-1 when they do not exceed 1); alpha, palette transparency and a transparent colour key composited onto
    :data:`BACKGROUND`; CMYK and YCbCr converted by PIL."""
    img = ImageOps.exif_transpose(img)
    if img.mode.startswith("I") or img.mode == "F":
        img = Image.fromarray(_to_uint8(np.asarray(img), img.mode), "L")
    if img.mode in ("P", "L", "RGB") and "transparency" in img.info or img.mode in ("PA", "La", "RGBa"):
        img = img.convert("RGBA")
    if img.mode in ("LA", "RGBA"):
        background = Image.new("RGBA", img.size, (*BACKGROUND, 255))
        return Image.alpha_composite(background, img.convert("RGBA")).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


def _to_uint8(pixels: np.ndarray, mode: str) -> np.ndarray:
    """Grayscale pixels of a 16/32-bit integer or float mode -> uint8, scaled (65535 -> 255), not clipped."""
    values = pixels.astype(np.float64)
    if mode == "F":
        scale = 255.0 if values.size and values.max() <= 1.0 else 1.0
    elif mode.startswith("I;16") or (values.size and values.max() > 255):
        scale = 255.0 / 65535.0
    else:
        scale = 1.0
    return np.clip(np.rint(values * scale), 0, 255).astype(np.uint8)


def _normalise() -> Callable[[Image.Image], torch.Tensor]:
    return T.Compose([T.ToTensor(), T.Normalize(OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)])


def eval_geometry(image_size: int) -> Callable[[Image.Image], Image.Image]:
    """PIL RGB image -> PIL image of image_size x image_size: shorter side resize (bicubic) + centre crop."""
    return T.Compose([T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(image_size)])


def eval_transform(image_size: int) -> Callable[[Image.Image], torch.Tensor]:
    """PIL RGB image -> (3, image_size, image_size) normalised tensor: shorter side resize + centre crop."""
    return T.Compose([eval_geometry(image_size), _normalise()])


def normalise_batch(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (B, 3, S, S) -> float (B, 3, S, S) normalised with the CLIP mean/std; bitwise what
    ``ToTensor`` + ``Normalize`` give image by image."""
    mean = torch.as_tensor(OPENAI_DATASET_MEAN, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.as_tensor(OPENAI_DATASET_STD, dtype=torch.float32).view(1, -1, 1, 1)
    return images.to(torch.float32, copy=True).div_(255).sub_(mean).div_(std)


class SeededRandomResizedCrop:
    """torchvision's RandomResizedCrop with crop parameters drawn from a ``random.Random`` we own (torchvision
    draws from the global torch RNG, which a data loader must not consume or depend on)."""

    def __init__(self, image_size: int, rng: random.Random):
        self.image_size, self.rng = image_size, rng
        self.finish = _normalise()

    def _params(self, width: int, height: int) -> tuple[int, int, int, int]:
        area = width * height
        log_ratio = (math.log(RRC_RATIO[0]), math.log(RRC_RATIO[1]))
        for _ in range(10):  # the same rejection sampling as torchvision's RandomResizedCrop.get_params
            target = area * self.rng.uniform(*RRC_SCALE)
            ratio = math.exp(self.rng.uniform(*log_ratio))
            w, h = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
            if 0 < w <= width and 0 < h <= height:
                return self.rng.randint(0, height - h), self.rng.randint(0, width - w), h, w
        side = min(width, height)  # fallback: central square crop
        return (height - side) // 2, (width - side) // 2, side, side

    def __call__(self, img: Image.Image) -> torch.Tensor:
        top, left, h, w = self._params(*img.size)
        img = TF.resized_crop(img, top, left, h, w, [self.image_size, self.image_size],
                              interpolation=T.InterpolationMode.BICUBIC)
        return self.finish(img)


def load_image(source: str | Path | bytes, image_size: int) -> torch.Tensor:
    """One image file (or its bytes) -> (3, image_size, image_size) float tensor, preprocessed as for evaluation.

    Raises ``FileNotFoundError`` for a missing path and ``ValueError`` naming the file for an empty, unreadable,
    non-image or too large (> 10,000 px per side or > 50 MP) file."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        name, data = "image bytes", bytes(source)
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"image file not found: {path}")
        if not path.is_file():
            raise ValueError(f"{path}: not a file, expected an image")
        name, data = str(path), read_image_file(path)
    return eval_transform(image_size)(open_image(data, name))
