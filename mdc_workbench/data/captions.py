"""Captions and compositional negatives for synthetic scenes.

Short captions (alt-text, like CC3M) are built from a :class:`ShortSpec` (which objects are mentioned, with
which attributes, an optional spatial relation, object count or background) so that negatives can be made by
editing the structure and re-rendering, and every negative can be checked to be *false* for the scene with
:func:`spec_is_true`. Long captions (descriptive, like Recap-DataComp) describe every object, its size, colour,
shape and position, relations between neighbours in the list, and the background.

Negative categories (ARO / SugarCrepe), all derived from the short caption; a category that cannot be formed,
or whose result would be true for the scene, is left out rather than faked:
``attribute_swap``  swap the colours (else sizes) of two mentioned objects; for one object, swap its colour
                    with the background's when the caption names the background (ARO VG-attribution style);
``relation_swap``   swap the two objects of a spatial-relation caption (ARO VG-relation);
``order_shuffle``   the caption's words in a random different order (ARO COCO-order);
``replace``         one colour or shape word replaced by one that is in no object of the scene (SugarCrepe);
``add``             one more object whose shape is in no object of the scene (SugarCrepe add-obj).

Two-clause captions (:func:`clause_caption`, caption style ``clauses``) test the paper's central argument: each
names three of six facts about the primary object (size, colour, shape, row, column, background) in a first
clause, then a second clause that either restates it word for word (group ``predictable``, connector "again":
every later word is determined by the earlier ones) or names the other three facts (group ``unpredictable``,
connector "also": every later scene word is new visual information). The facts of every clause come in a random
order, so every fact (word type) is as likely at every place of a caption in both groups; only whether the
later words are predictable from the earlier ones differs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from mdc_workbench.data.scene import COLOURS, COLS, ROWS, SHAPES, Scene, SceneObject

NEGATIVE_TYPES: tuple[str, ...] = ("attribute_swap", "relation_swap", "order_shuffle", "replace", "add")
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
_NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
_PREFIXES = ("a photo of ", "an image of ", "a picture of ", "a drawing of ", "a close up of ", "clip art of ")
_SHORT_POS = {"top left": "in the top left", "top": "at the top", "top right": "in the top right",
              "left": "on the left", "center": "in the center", "right": "on the right",
              "bottom left": "in the bottom left", "bottom": "at the bottom", "bottom right": "in the bottom right"}
_LONG_POS = {"top left": "at the top left", "top": "at the top", "top right": "at the top right",
             "left": "on the left", "center": "in the center", "right": "on the right",
             "bottom left": "at the bottom left", "bottom": "at the bottom", "bottom right": "at the bottom right"}
_SHORT_MAX_WORDS = 12
_LONG_MAX_WORDS = 60
_LONG_REL = {"left of": "to the left of", "right of": "to the right of", "above": "above", "below": "below"}


@dataclass(frozen=True)
class Mention:
    """An object as a caption names it; attributes left as None are not said."""

    shape: str
    colour: str | None = None
    size: str | None = None
    position: str | None = None

    def matches(self, obj: SceneObject) -> bool:
        return (self.shape == obj.shape and self.colour in (None, obj.colour) and self.size in (None, obj.size)
                and self.position in (None, obj.position))


@dataclass(frozen=True)
class ShortSpec:
    """Structure of a short caption. `relation` holds between mentions[0] and mentions[1]."""

    mentions: tuple[Mention, ...]
    prefix: str = ""
    relation: str | None = None
    count: int | None = None  # "three shapes including ..."
    background: str | None = None


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _phrase(m: Mention) -> str:
    words = [w for w in (m.size, m.colour, m.shape) if w]
    text = f"{_article(words[0])} {' '.join(words)}"
    return f"{text} {_SHORT_POS[m.position]}" if m.position else text


def render_short(spec: ShortSpec) -> str:
    """The caption text of `spec`."""
    phrases = [_phrase(m) for m in spec.mentions]
    if spec.relation:
        phrases = [f"{phrases[0]} {spec.relation} {phrases[1]}"] + phrases[2:]
    body = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
    if spec.count:
        body = f"{_NUMBERS[spec.count]} shapes including {body}"
    text = spec.prefix + body
    if spec.background:
        text += f" on {_article(spec.background)} {spec.background} background"
    return text


def _relation(a: SceneObject, b: SceneObject) -> str:
    """The relation word that holds from `a` to `b` (columns first, as people read left to right)."""
    if a.col != b.col:
        return "left of" if a.col < b.col else "right of"
    return "above" if a.row < b.row else "below"


def _holds(a: SceneObject, b: SceneObject, rel: str) -> bool:
    return {"left of": a.col < b.col, "right of": a.col > b.col, "above": a.row < b.row,
            "below": a.row > b.row}[rel]


def spec_is_true(spec: ShortSpec, scene: Scene) -> bool:
    """Whether `spec` describes `scene`: distinct objects match the mentions and the relation/count/background
    hold."""
    if spec.background is not None and spec.background != scene.background:
        return False
    if spec.count is not None and spec.count != len(scene.objects):
        return False
    objs = scene.objects
    for chosen in itertools.permutations(range(len(objs)), len(spec.mentions)):
        if all(m.matches(objs[i]) for m, i in zip(spec.mentions, chosen, strict=False)):
            if spec.relation is None or _holds(objs[chosen[0]], objs[chosen[1]], spec.relation):
                return True
    return False


def _mention(obj: SceneObject, rng: np.random.Generator, p_size: float, p_pos: float = 0.0) -> Mention:
    size = obj.size if rng.random() < p_size else None
    pos = obj.position if rng.random() < p_pos else None
    return Mention(obj.shape, obj.colour, size, pos)


def short_caption(scene: Scene, rng: np.random.Generator) -> tuple[ShortSpec, str]:
    """A short alt-text caption (3-12 words) of `scene` and its structure. Always names the primary object's
    colour and shape; a second object is named when the scene has one and the template asks for it."""
    objs = scene.objects
    prefix = _PREFIXES[int(rng.integers(len(_PREFIXES)))] if rng.random() < 0.4 else ""
    template = str(rng.choice(["list", "relation", "count"], p=[0.45, 0.35, 0.2])) if len(objs) > 1 else "single"
    first = _mention(objs[0], rng, p_size=0.35, p_pos=0.3 if template == "single" else 0.0)
    others = [o for o in objs[1:] if (o.colour, o.shape) != (objs[0].colour, objs[0].shape)]
    other = others[int(rng.integers(len(others)))] if others else None  # not "a red circle and a red circle"
    second = _mention(other, rng, p_size=0.2) if other is not None else None
    if second is None and template == "relation":
        template = "count"
    bg = scene.background if rng.random() < 0.25 else None
    if template == "single":
        spec = ShortSpec((first,), prefix, background=bg)
    elif template == "relation":
        assert other is not None and second is not None
        spec = ShortSpec((replace(first, size=None), replace(second, size=None)), "",
                         relation=_relation(objs[0], other))
    elif template == "count":
        spec = ShortSpec((replace(first, position=None),), "", count=len(objs), background=bg)
    else:
        two = second is not None and rng.random() < 0.7
        spec = ShortSpec((first, second) if two else (first,), prefix, background=bg)  # type: ignore[arg-type]
    for trim in (dict(background=None), dict(prefix=""), dict(mentions=tuple(replace(m, size=None, position=None)
                                                                        for m in spec.mentions))):
        if len(render_short(spec).split()) <= _SHORT_MAX_WORDS:
            break
        spec = replace(spec, **trim)  # type: ignore[arg-type]
    return spec, render_short(spec)


def long_caption(scene: Scene, rng: np.random.Generator) -> str:
    """A descriptive caption (about 25-60 words): every object with size, colour, shape and position, relations
    between consecutive objects, and the background colour."""
    objs, bg = scene.objects, scene.background
    if len(objs) == 1:
        o = objs[0]
        return (f"The image shows a single {o.size} {o.colour} {o.shape} on a plain {bg} background. "
                f"The {o.shape} is placed {_LONG_POS[o.position]} of the picture and it is the only object "
                f"in the scene. Its {o.colour} color stands out clearly against the {bg} background.")
    sentences = [f"The image shows {_NUMBERS[len(objs)]} shapes on a plain {bg} background."]
    for i, o in enumerate(objs):
        desc, where = f"{o.size} {o.colour} {o.shape}", _LONG_POS[o.position]
        forms = (f"There is {_article(desc)} {desc} {where}.", f"{_article(desc).capitalize()} {desc} is {where}.",
                 f"{where.capitalize()} is {_article(desc)} {desc}.")
        if i == 0:
            forms = (f"The main object is {_article(desc)} {desc} {where}.",) + forms[:2]
        sentences.append(forms[int(rng.integers(len(forms)))])
    for i, (a, b) in enumerate(zip(objs, objs[1:], strict=False)):
        da, db = f"{a.colour} {a.shape}", f"{b.colour} {b.shape}"
        db = f"other {db}" if db == da else db
        rel = f"The {da} is {_LONG_REL[_relation(a, b)]} the {db}."
        if i > 0 and len(" ".join(sentences + [rel]).split()) > _LONG_MAX_WORDS:
            break
        sentences.append(rel)
    return " ".join(sentences)


# ----------------------------------------------------------------------------------------------------------
# two-clause captions (predictable vs unpredictable later words)

CLAUSE_FACTS: tuple[str, ...] = ("size", "colour", "shape", "row", "column", "background")
CLAUSE_GROUPS: tuple[str, ...] = ("predictable", "unpredictable")
CLAUSE_CONNECTORS: dict[str, str] = {"predictable": "again", "unpredictable": "also"}


def render_clause(obj: SceneObject, background: str, facts: Sequence[str]) -> str:
    """The clause naming `facts` (in :data:`CLAUSE_FACTS`) of `obj` in the order given, one phrase per fact: its
    size, colour, shape, row (top / middle / bottom) or column (left / center / right) word, or ``on`` and the
    background, e.g. ``top on white red``."""
    words = {"size": obj.size, "colour": obj.colour, "shape": obj.shape, "row": ROWS[obj.row],
             "column": COLS[obj.col], "background": f"on {background}"}
    return " ".join(words[f] for f in facts)


def clause_caption(scene: Scene, rng: np.random.Generator) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
    """A two-clause caption of the primary object: (text, group, facts of the first clause, of the second).

    The group is a fair coin; the first clause names three of :data:`CLAUSE_FACTS` in a random order (a uniform
    3-permutation); the second restates it word for word (``predictable``, e.g. "top on white red, again top on
    white red") or names the other three facts in a random order (``unpredictable``, e.g. "top on white red,
    also circle left large"). Every fact is as likely at every place of either clause, in both groups."""
    group = CLAUSE_GROUPS[int(rng.integers(len(CLAUSE_GROUPS)))]
    order = [CLAUSE_FACTS[int(i)] for i in rng.permutation(len(CLAUSE_FACTS))]  # drawn for both groups
    first = tuple(order[:3])
    second = first if group == "predictable" else tuple(order[3:])
    obj = scene.objects[0]
    text = (f"{render_clause(obj, scene.background, first)}, {CLAUSE_CONNECTORS[group]} "
            f"{render_clause(obj, scene.background, second)}")
    return text, group, first, second


def parse_clause_caption(text: str, vocab: dict[str, list]) -> tuple[str, list[dict[str, str]]]:
    """From the text alone: (group by its connector, [facts of clause 1, facts of clause 2]) with each clause's
    facts as ``{fact: word}``; `vocab` is the data set's vocabularies (manifest ``vocab``)."""
    found = [(g, *text.partition(f", {c} ")[::2]) for g, c in CLAUSE_CONNECTORS.items() if f", {c} " in text]
    if not found:
        raise ValueError(f"not a two-clause caption (no ', again ' or ', also '): {text!r}")
    group, head, tail = found[0]
    kinds = {**{w: "size" for w in vocab["size"]}, **{w: "colour" for w in vocab["colour"]},
             **{w: "shape" for w in vocab["shape"]}, **{w: "row" for w in ROWS}, **{w: "column" for w in COLS}}
    backgrounds = sorted(vocab["background"], key=lambda b: -len(b.split()))  # "light blue" before "blue"
    clauses = []
    for clause in (head, tail):
        words, facts = clause.split(), {}
        while words:
            word = words.pop(0)
            if word == "on":  # the background: one name, possibly of two words
                name = next((b for b in backgrounds if b.split() == words[: len(b.split())]), None)
                if name is None:
                    raise ValueError(f"no background name after 'on' in {text!r}")
                facts["background"] = name
                words = words[len(name.split()):]
            elif word in kinds:
                facts[kinds[word]] = word
        clauses.append(facts)
    return group, clauses


# ----------------------------------------------------------------------------------------------------------
# negatives


def _heldout_pattern(forbidden: set[tuple[str, str]] | None) -> re.Pattern[str] | None:
    if not forbidden:
        return None
    return re.compile("|".join(rf"\b{c} {s}\b" for c, s in sorted(forbidden)))


def negatives(spec: ShortSpec, scene: Scene, rng: np.random.Generator,
              forbidden: set[tuple[str, str]] | None = None, shapes: tuple[str, ...] = SHAPES) -> dict[str, str]:
    """Hard negatives of the short caption `spec`, category -> text (categories in :data:`NEGATIVE_TYPES`).

    Each negative differs from the caption and is false for `scene`; a negative that would name a `forbidden`
    (held-out) colour-shape pair is left out, so held-out pairs appear in no text outside the compgen split.
    Replaced and added shapes come from `shapes` (the data set's shapes, so no negative names a shape the data
    never shows).
    """
    caption = render_short(spec)
    pattern = _heldout_pattern(forbidden)
    out: dict[str, str] = {}

    def keep(kind: str, neg: ShortSpec) -> bool:
        if spec_is_true(neg, scene):
            return False
        text = render_short(neg)
        if text == caption or (pattern and pattern.search(text)):
            return False
        out[kind] = text
        return True

    ms = spec.mentions
    swap = None
    if len(ms) >= 2 and ms[0].colour != ms[1].colour:
        swap = (replace(ms[0], colour=ms[1].colour), replace(ms[1], colour=ms[0].colour)) + ms[2:]
    elif len(ms) >= 2 and ms[0].size and ms[1].size and ms[0].size != ms[1].size:
        swap = (replace(ms[0], size=ms[1].size), replace(ms[1], size=ms[0].size)) + ms[2:]
    if swap is not None:
        keep("attribute_swap", replace(spec, mentions=swap))
    elif len(ms) == 1 and spec.background and ms[0].colour:  # bind the object's colour to the background
        keep("attribute_swap", replace(spec, mentions=(replace(ms[0], colour=spec.background),),
                                       background=ms[0].colour))
    if spec.relation:
        keep("relation_swap", replace(spec, mentions=(ms[1], ms[0]) + ms[2:]))

    words = caption.split()
    for _ in range(10):
        shuffled = " ".join(words[i] for i in rng.permutation(len(words)))
        if shuffled != caption and not (pattern and pattern.search(shuffled)):
            out["order_shuffle"] = shuffled
            break

    scene_colours = {o.colour for o in scene.objects}
    scene_shapes = {o.shape for o in scene.objects}
    free_colours = [c for c in COLOURS if c not in scene_colours]
    free_shapes = [s for s in shapes if s not in scene_shapes]
    for _ in range(5):  # a replacement or addition may be rejected (held-out pair); try a few
        slot = int(rng.integers(len(ms)))
        if rng.random() < 0.5 and ms[slot].colour:
            new = replace(ms[slot], colour=free_colours[int(rng.integers(len(free_colours)))])
        else:
            new = replace(ms[slot], shape=free_shapes[int(rng.integers(len(free_shapes)))])
        if keep("replace", replace(spec, mentions=ms[:slot] + (new,) + ms[slot + 1:])):
            break
    for _ in range(5):
        added = Mention(free_shapes[int(rng.integers(len(free_shapes)))],
                        list(COLOURS)[int(rng.integers(len(COLOURS)))])
        if keep("add", replace(spec, mentions=ms + (added,))):
            break
    return out


# ----------------------------------------------------------------------------------------------------------
# linked attributes in either caption order (the consequence of the central claim for features)

LINKED_STYLES: tuple[str, ...] = ("shape_last", "colour_last")
LINK_SHARE = 0.8  # share of images whose main object's shape follows its colour (docs/evidence.md, declared)


def linked_shape(colour: str, shapes: Sequence[str]) -> str:
    """The shape `colour` links to: the i-th colour of :data:`~mdc_workbench.data.scene.COLOURS` ->
    ``shapes[i % n]``."""
    return shapes[list(COLOURS).index(colour) % len(shapes)]


def link_scene(scene: Scene, rng: np.random.Generator, shapes: Sequence[str],
               heldout: set[tuple[str, str]]) -> Scene:
    """With probability :data:`LINK_SHARE` the main object's shape becomes its colour's linked shape (kept as drawn
    when that pair is held out); one draw of `rng` either way."""
    main = scene.objects[0]
    shape = linked_shape(main.colour, shapes)
    if rng.random() >= LINK_SHARE or (main.colour, shape) in heldout:
        return scene
    return replace(scene, objects=(replace(main, shape=shape), *scene.objects[1:]))


def order_caption(scene: Scene, style: str) -> str:
    """The main object's colour and shape, the shape last (``a red circle``) or the colour last (``a circle in
    red``)."""
    if style not in LINKED_STYLES:
        raise ValueError(f"caption order must be one of {', '.join(LINKED_STYLES)}, got {style!r}")
    obj = scene.objects[0]
    return f"a {obj.colour} {obj.shape}" if style == "shape_last" else f"a {obj.shape} in {obj.colour}"


__all__ = ["CLAUSE_CONNECTORS", "CLAUSE_FACTS", "CLAUSE_GROUPS", "LINKED_STYLES", "LINK_SHARE", "Mention",
           "NEGATIVE_TYPES", "RELATIONS", "ShortSpec", "clause_caption", "link_scene", "linked_shape", "long_caption",
           "negatives", "order_caption", "parse_clause_caption", "render_clause", "render_short", "short_caption",
           "spec_is_true"]
