"""Scenes of the embedded synthetic data set: vocabularies, sampling and drawing (docs/design.md "Embedded data").

A scene is 1-4 non-overlapping objects on a plain, slightly noisy background. Each object has a shape, a colour,
a size and a cell of a 3x3 grid (its position). Everything about image ``index`` of split ``split`` is drawn
from ``numpy.random.default_rng([seed, split_id, index])``, so any single example can be regenerated alone and
the same seed always gives byte-identical JPEGs, captions and metadata (for a given Pillow/libjpeg build).

The *primary* object (whose attributes are the probe labels) is objects[0]: the largest object, ties broken by
reading order (top row first, then left to right), so it is a function of the picture alone.

A fixed, seed-determined set of (colour, shape) pairs, :func:`heldout_combos`, never appears in the
train/val/test splits; every ``compgen`` image has one as its (large, primary) object, all other objects small.

A :class:`Difficulty` names the scene settings. ``paper`` (the default, the data set the paper's tables are
reproduced on) draws 7 shapes, 1-4 objects, radii 0.10/0.15; ``easy`` drops the two shapes that are confusable
with others at 64 px (hexagon ~ circle, diamond ~ square), draws 1-3 objects and makes small objects larger
(radius 0.12), so a CPU model learns shape words in a fraction of the steps (docs/fast_recipe.md). Every other
choice (colours, backgrounds, positions, captions, negatives, held-out pairs, compgen) works the same way.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

SYNTH_VERSION = "1.0"  # bump when the images, captions or metadata of a given seed change

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "diamond", "hexagon", "cross")
COLOURS: dict[str, tuple[int, int, int]] = {  # saturated object colours, far apart after JPEG at 32-64 px
    "red": (215, 35, 35),
    "orange": (245, 135, 20),
    "yellow": (240, 220, 40),
    "green": (40, 160, 55),
    "cyan": (40, 205, 215),
    "blue": (40, 75, 215),
    "purple": (130, 55, 185),
    "pink": (245, 125, 190),
    "brown": (120, 75, 35),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {  # muted backgrounds, none of them an object colour
    "white": (240, 240, 238),
    "black": (22, 22, 24),
    "gray": (128, 128, 128),
    "beige": (222, 206, 170),
    "light blue": (180, 206, 232),
}
SIZES: tuple[str, ...] = ("small", "large")
ROWS: tuple[str, ...] = ("top", "middle", "bottom")
COLS: tuple[str, ...] = ("left", "center", "right")
POSITIONS: tuple[str, ...] = ("top left", "top", "top right", "left", "center", "right",
                              "bottom left", "bottom", "bottom right")  # index = 3 * row + col
COUNTS: tuple[int, ...] = (1, 2, 3, 4)
SPLITS: tuple[str, ...] = ("train", "val", "test", "compgen")
LABEL_NAMES: tuple[str, ...] = ("shape", "colour", "size", "position", "count", "background")
N_HELDOUT = 6  # ~10% of the 63 (colour, shape) pairs

_JPEG_QUALITY = 95  # img2dataset's default encode_quality


@dataclass(frozen=True)
class Difficulty:
    """Scene settings: the shapes drawn, the most objects per scene and the object radii (fractions of the side;
    at most 1/6 - 0.012 so an object stays inside its cell)."""

    name: str
    shapes: tuple[str, ...]
    max_objects: int
    radius: tuple[tuple[str, float], ...]  # (size word, radius), for each of SIZES
    salient_primary: bool = False  # scenes of 2+ objects: exactly one large object (the primary), the rest small

    def radius_of(self, size: str) -> float:
        return dict(self.radius)[size]


DIFFICULTIES: dict[str, Difficulty] = {
    "paper": Difficulty("paper", SHAPES, 4, (("small", 0.1), ("large", 0.15))),
    "easy": Difficulty("easy", ("circle", "square", "triangle", "star", "cross"), 3,
                       (("small", 0.11), ("large", 0.15)), salient_primary=True),
}


def get_difficulty(difficulty: str | Difficulty) -> Difficulty:
    """The :class:`Difficulty` named `difficulty` (one of :data:`DIFFICULTIES`), or `difficulty` itself."""
    if isinstance(difficulty, Difficulty):
        return difficulty
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown data difficulty {difficulty!r}; expected one of {', '.join(DIFFICULTIES)}")
    return DIFFICULTIES[difficulty]


@dataclass(frozen=True)
class SceneObject:
    """One object of a scene. `row`/`col` index the 3x3 grid; `cx`/`cy`/`radius` are fractions of the side."""

    shape: str
    colour: str
    size: str
    row: int
    col: int
    cx: float
    cy: float
    radius: float

    @property
    def position(self) -> str:
        return POSITIONS[3 * self.row + self.col]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["position"] = self.position
        d["bbox"] = [round(v, 4) for v in (self.cx - self.radius, self.cy - self.radius,
                                           self.cx + self.radius, self.cy + self.radius)]
        for k in ("cx", "cy", "radius"):
            d[k] = round(d[k], 4)
        return d


@dataclass(frozen=True)
class Scene:
    """Objects (primary first) on a background; `noise_std` is the pixel noise in uint8 units."""

    objects: tuple[SceneObject, ...]
    background: str
    bg_rgb: tuple[int, int, int]
    obj_rgb: tuple[tuple[int, int, int], ...]  # jittered colour actually drawn, per object
    noise_std: float

    def labels(self) -> dict[str, Any]:
        """Probe labels: attributes of the primary object, object count and background name."""
        p = self.objects[0]
        return {"shape": p.shape, "colour": p.colour, "size": p.size, "position": p.position,
                "count": len(self.objects), "background": self.background}


def split_id(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    return SPLITS.index(split)


def example_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator every random choice about example `index` of `split` is drawn from."""
    return np.random.default_rng([seed, split_id(split), index])


def heldout_combos(seed: int, difficulty: str | Difficulty = "paper") -> list[tuple[str, str]]:
    """The (colour, shape) pairs held out of train/val/test for `seed`: distinct colours and distinct shapes,
    so every colour and every shape is still seen in training with other partners (N_HELDOUT pairs, fewer when
    the difficulty has fewer shapes: one per shape at most)."""
    shapes_all = get_difficulty(difficulty).shapes
    k = min(N_HELDOUT, len(shapes_all))
    rng = np.random.default_rng([seed, 7919])
    colours = [list(COLOURS)[i] for i in rng.permutation(len(COLOURS))[:k]]
    shapes = [shapes_all[i] for i in rng.permutation(len(shapes_all))[:k]]
    return sorted(zip(colours, shapes, strict=False))


def sample_scene(rng: np.random.Generator, heldout: set[tuple[str, str]], compgen: bool = False,
                 difficulty: str | Difficulty = "paper") -> Scene:
    """Draw a scene. Outside compgen no object is a held-out pair; in compgen the primary object is one."""
    diff = get_difficulty(difficulty)
    shapes = diff.shapes
    n = int(rng.integers(1, diff.max_objects + 1))  # uniform over 1..max_objects
    cells = rng.choice(9, size=n, replace=False)
    colours, heldout_list = list(COLOURS), sorted(heldout)
    raw = []
    for i, cell in enumerate(cells):
        if compgen and i == 0:
            colour, shape = heldout_list[int(rng.integers(len(heldout_list)))]
            size = "large"
        else:
            while True:
                colour, shape = colours[int(rng.integers(len(colours)))], shapes[int(rng.integers(len(shapes)))]
                if compgen or (colour, shape) not in heldout:
                    break
            size = "small" if compgen else SIZES[int(rng.integers(2))]
            if diff.salient_primary and n > 1:
                size = "large" if i == 0 else "small"
        row, col = divmod(int(cell), 3)
        radius = diff.radius_of(size)
        slack = 1 / 6 - radius - 0.012  # keep the whole object inside its cell: objects never overlap
        jx, jy = rng.uniform(-slack, slack, size=2)
        raw.append(SceneObject(shape, colour, size, row, col, (col + 0.5) / 3 + jx, (row + 0.5) / 3 + jy, radius))
    objects = sorted(raw, key=lambda o: (o.size != "large", o.row, o.col))  # primary = largest, reading order
    bg_name = list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]
    bg = _jitter(rng, BACKGROUNDS[bg_name], 8)
    obj_rgb = tuple(_jitter(rng, COLOURS[o.colour], 12) for o in objects)
    return Scene(tuple(objects), bg_name, bg, obj_rgb, float(rng.uniform(2.0, 6.0)))


def _jitter(rng: np.random.Generator, rgb: tuple[int, int, int], amount: int) -> tuple[int, int, int]:
    delta = rng.integers(-amount, amount + 1, size=3)
    return tuple(min(255, max(0, c + int(d))) for c, d in zip(rgb, delta, strict=False))  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------------------
# drawing


def _unit_polygon(shape: str) -> list[tuple[float, float]]:
    """Vertices of `shape` in a [-1, 1]^2 box (y down)."""
    if shape == "square":
        return [(-0.82, -0.82), (0.82, -0.82), (0.82, 0.82), (-0.82, 0.82)]
    if shape == "triangle":
        return [(0.0, -0.95), (1.0, 0.8), (-1.0, 0.8)]
    if shape == "diamond":
        return [(0.0, -1.0), (0.72, 0.0), (0.0, 1.0), (-0.72, 0.0)]
    if shape == "hexagon":
        return [(float(np.cos(a)), float(np.sin(a)) * 0.98) for a in np.arange(6) * np.pi / 3]
    if shape == "star":
        pts = []
        for k in range(10):
            r = 1.0 if k % 2 == 0 else 0.42
            a = -np.pi / 2 + k * np.pi / 5
            pts.append((r * float(np.cos(a)), r * float(np.sin(a)) + 0.1))
        return pts
    if shape == "cross":
        w = 0.34
        return [(-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w), (w, 1), (-w, 1), (-w, w), (-1, w),
                (-1, -w), (-w, -w)]
    raise ValueError(f"unknown shape {shape!r}")


_POLYGONS = {s: _unit_polygon(s) for s in SHAPES if s != "circle"}


def render_scene(scene: Scene, image_size: int, rng: np.random.Generator) -> Image.Image:
    """Draw `scene` as an RGB image of side `image_size`: supersampled, box-downscaled, plus Gaussian noise."""
    ss = 4 if image_size <= 128 else 2  # supersampling factor for anti-aliasing
    side = image_size * ss
    img = Image.new("RGB", (side, side), scene.bg_rgb)
    draw = ImageDraw.Draw(img)
    for obj, rgb in zip(scene.objects, scene.obj_rgb, strict=False):
        cx, cy, r = obj.cx * side, obj.cy * side, obj.radius * side
        if obj.shape == "circle":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=rgb)
        else:
            draw.polygon([(cx + x * r, cy + y * r) for x, y in _POLYGONS[obj.shape]], fill=rgb)
    img = img.reduce(ss)  # box filter: each output pixel is the mean of an ss x ss block
    noise = rng.standard_normal(size=(image_size, image_size, 3), dtype=np.float32) * scene.noise_std
    arr = np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(arr)


def encode_jpeg(img: Image.Image, quality: int = _JPEG_QUALITY) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def vocabularies(difficulty: str | Difficulty = "paper") -> dict[str, list[Any]]:
    """Label name -> ordered list of values (the class index of a value is its position)."""
    diff = get_difficulty(difficulty)
    return {"shape": list(diff.shapes), "colour": list(COLOURS), "size": list(SIZES), "position": list(POSITIONS),
            "count": list(COUNTS[:diff.max_objects]), "background": list(BACKGROUNDS)}
