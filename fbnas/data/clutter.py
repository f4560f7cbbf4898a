"""Cluttered, translated digits: the canvases of `data.dataset: cluttered_digits`.

The construction of cluttered MNIST (Mnih et al., "Recurrent Models of Visual Attention",
2014), the task used to test receptive fields and attention, on scikit-learn's bundled 8x8
digits: each canvas (the space's input size, zeros) holds one digit, scaled to `digit_size`
pixels and put at a uniformly random place, and `fragments` random `fragment_size` x
`fragment_size` crops of *other* source digits at random places, combined by the pixel-wise
maximum. Its label is the digit's. A network has to find the digit among digit-like strokes
anywhere on the canvas, so its receptive field (kernel sizes, depth) and width matter, where
on the centred digits a small network is already near the ceiling.

`draw` makes the canvases of one part of the source digits (train, val or test), fragments
coming only from that part's digits, from one seed: the same inputs give the same arrays.
`fbnas.data.sources` splits the sources and calls it once per part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Canvases:
    """The canvases of one part of the sources, and where each pixel came from."""

    images: np.ndarray  # (N, H, W) float32 in [0, 1]
    labels: np.ndarray  # (N,) int64: the digit's label
    source: np.ndarray  # (N,) int64: the index (into the digit images) of each canvas's digit
    fragments: np.ndarray  # (N, fragments) int64: the digit each clutter fragment is cut from


def scale_digits(images: np.ndarray, side: int) -> np.ndarray:
    """(M, 8, 8) digits in [0, 1] -> (M, side, side): bilinear (antialiased when smaller)."""
    if side == images.shape[-1]:
        return images
    x = torch.from_numpy(np.ascontiguousarray(images))[:, None]
    x = F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False,
                      antialias=side < images.shape[-1])
    return x[:, 0].clamp_(0.0, 1.0).numpy()


def draw(digits: np.ndarray, labels: np.ndarray, sources: np.ndarray, size: tuple[int, int],
         fragments: int, fragment_size: int, per_source: int, seed: int) -> Canvases:
    """`per_source` canvases of each digit `digits[s]` (s in `sources`, in order), each with
    `fragments` crops of other digits of `sources`, drawn from `seed` (numpy's PCG64).

    `digits`: (M, d, d) in [0, 1], already at the size they are drawn; d and `fragment_size`
    must fit `size` (the caller checks and names the setting). A part of one source cannot
    have fragments (a fragment comes from another digit)."""
    h, w = size
    d = digits.shape[-1]
    fs = fragment_size
    sources = np.asarray(sources, dtype=np.int64)
    n_src = len(sources)
    n = n_src * per_source
    rng = np.random.Generator(np.random.PCG64(seed))
    own = np.repeat(np.arange(n_src), per_source)  # position in `sources` of each canvas's digit
    at = np.stack([rng.integers(0, h - d + 1, n), rng.integers(0, w - d + 1, n)], axis=1)
    if fragments and n_src == 1:
        raise ValueError(f"cluttered digits: {n_src} source digit(s) in a part; fragments "
                         "come from other digits of the part, which needs 2 at least")
    # another source of the part for each fragment: draw from n_src - 1 and skip the own
    other = rng.integers(0, max(n_src - 1, 1), (n, fragments))
    other = other + (other >= own[:, None])
    crop = rng.integers(0, d - fs + 1, (n, fragments, 2))
    put = np.stack([rng.integers(0, h - fs + 1, (n, fragments)),
                    rng.integers(0, w - fs + 1, (n, fragments))], axis=-1)
    images = np.zeros((n, h, w), dtype=np.float32)
    rows = np.arange(n)[:, None, None]

    def paste(pieces: np.ndarray, top: np.ndarray, left: np.ndarray) -> None:
        """Each canvas i <- max(canvas, pieces[i]) at (top[i], left[i]): one piece a canvas."""
        k = pieces.shape[-1]
        ys = top[:, None, None] + np.arange(k)[None, :, None]
        xs = left[:, None, None] + np.arange(k)[None, None, :]
        images[rows, ys, xs] = np.maximum(images[rows, ys, xs], pieces)

    ar = np.arange(fs)
    for j in range(fragments):  # one fragment of every canvas at a time
        cy, cx = crop[:, j, 0], crop[:, j, 1]
        pieces = digits[sources[other[:, j]][:, None, None], (cy[:, None] + ar)[:, :, None],
                        (cx[:, None] + ar)[:, None, :]]
        paste(pieces, put[:, j, 0], put[:, j, 1])
    paste(digits[sources[own]], at[:, 0], at[:, 1])
    return Canvases(images=images, labels=np.asarray(labels, dtype=np.int64)[sources[own]],
                    source=sources[own], fragments=sources[other].reshape(n, fragments))
