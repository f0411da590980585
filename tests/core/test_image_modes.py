"""open_image decodes every common image mode to the RGB a viewer shows: 16-bit scaled (not clipped), alpha and
palette transparency composited onto the neutral background, EXIF orientation applied; errors name no Python
object addresses."""

import io

import numpy as np
import pytest
from PIL import Image

from mdc_core.transforms import BACKGROUND, ImageError, open_image

RED, BLUE = (255, 0, 0), (0, 0, 255)


def _encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    img = open_image(data, "test")
    assert img.mode == "RGB"
    return np.asarray(img).astype(int)


def _close(pixel, expected, tol: int = 2) -> bool:
    return all(abs(int(a) - int(b)) <= tol for a, b in zip(pixel, expected, strict=True))


def test_the_neutral_background_is_the_clip_mean_colour():
    assert BACKGROUND == (123, 117, 104)  # round(255 * (0.48145466, 0.4578275, 0.40821073)) = round(122.77, ...)


def test_mode_1_bilevel():
    img = Image.new("1", (4, 4), 0)
    img.putpixel((0, 0), 1)
    px = _pixels(_encode(img))
    assert tuple(px[0, 0]) == (255, 255, 255) and tuple(px[1, 1]) == (0, 0, 0)


def test_mode_L():
    assert tuple(_pixels(_encode(Image.new("L", (4, 4), 77)))[2, 2]) == (77, 77, 77)


@pytest.mark.parametrize("value, expected", [(0, 0), (32896, 128), (65535, 255), (257 * 40, 40)])
def test_mode_I16_png_is_scaled_not_clipped(value, expected):
    img = Image.fromarray(np.full((4, 4), value, dtype=np.uint16))
    data = _encode(img)
    assert Image.open(io.BytesIO(data)).mode in ("I;16", "I")  # a 16-bit grayscale PNG
    assert tuple(_pixels(data)[1, 1]) == (expected,) * 3


def test_mode_P_with_a_transparent_palette_entry_shows_the_background_not_the_hidden_colour():
    img = Image.new("P", (4, 4), 0)
    img.putpalette([*RED, *BLUE] + [0] * 762)  # index 0 red (transparent), 1 blue
    img.putpixel((3, 3), 1)
    data = _encode(img, transparency=0)
    assert Image.open(io.BytesIO(data)).mode == "P"
    px = _pixels(data)
    assert tuple(px[0, 0]) == BACKGROUND and tuple(px[3, 3]) == BLUE


def test_mode_LA_composites_alpha():
    img = Image.new("LA", (4, 4), (200, 0))  # fully transparent light gray
    img.putpixel((1, 1), (50, 255))
    px = _pixels(_encode(img))
    assert tuple(px[0, 0]) == BACKGROUND and tuple(px[1, 1]) == (50, 50, 50)


def test_mode_RGBA_a_red_backed_transparent_image_is_not_red():
    img = Image.new("RGBA", (4, 4), (*RED, 0))  # transparent, hidden red
    img.putpixel((2, 2), (*BLUE, 255))
    img.putpixel((3, 3), (*BLUE, 128))  # half transparent: halfway between blue and the background
    px = _pixels(_encode(img))
    assert tuple(px[0, 0]) == BACKGROUND and tuple(px[2, 2]) == BLUE
    assert _close(px[3, 3], [(b + 128 * (c - b) / 255) for b, c in zip(BACKGROUND, BLUE, strict=True)], tol=1)


def test_mode_CMYK_jpeg():
    img = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # pure red in CMYK
    data = _encode(img, "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    assert _close(_pixels(data)[8, 8], RED, tol=6)


def test_mode_YCbCr_jpeg():
    ycc = Image.new("RGB", (16, 16), RED).convert("YCbCr")
    assert _close(_pixels(_encode(ycc, "JPEG", quality=95))[8, 8], RED, tol=6)


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (20, 10), BLUE)
    img.paste(RED, (0, 0, 10, 10))  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: shown rotated 90 degrees clockwise
    data = _encode(img, "JPEG", quality=95, exif=exif.tobytes())
    shown = open_image(data, "test")
    assert shown.size == (10, 20)  # portrait, as a viewer shows it
    px = np.asarray(shown).astype(int)
    assert _close(px[3, 5], RED, tol=8) and _close(px[16, 5], BLUE, tol=8)  # the left half is now on top


def test_errors_name_the_file_and_no_object_address():
    with pytest.raises(ImageError) as info:
        open_image(b"this is not an image at all", "upload.png")
    message = str(info.value)
    assert message.startswith("upload.png: not a readable image") and " at 0x" not in message
