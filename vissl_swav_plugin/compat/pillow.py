"""RandAugment / AutoAugment posterize with 0 bits under Pillow 13.

What breaks: ``vissl/data/ssl_transforms/rand_auto_aug.py``, ``posterize`` (ops
``Posterize`` / ``PosterizeIncreasing``) asks for 0 bits at some magnitudes; Pillow 13
raises ``ValueError: bits must be between or equal to 1 and 8`` where Pillow < 10 returned
a black image.

Fix (patch ``shim_pillow13_posterize``): 0 bits give that black image again; the op
table ``NAME_TO_OP`` (which holds the function object) is patched too.
"""
import functools

from vissl_swav_plugin.compat.engine import patch, raw, register


@register
def shim_pillow13_posterize():
    """vissl/data/ssl_transforms/rand_auto_aug.py, posterize(): levels map to 0..4 bits for
    "Posterize" (magnitude < 2.5) and "PosterizeIncreasing" (magnitude > 7.5).  Pillow < 10
    returned a black image for 0 bits; Pillow 13 raises "bits must be between or equal to
    1 and 8".  The op table NAME_TO_OP holds the function object, so patch both.
    """
    from vissl.data.ssl_transforms import rand_auto_aug as raa

    orig = raw(raa, "posterize")

    @functools.wraps(orig)
    def posterize(img, bits_to_keep, **kwargs):
        if bits_to_keep <= 0:  # keep no bit: every channel value becomes 0 (old Pillow)
            from PIL import ImageOps

            return ImageOps.posterize(img, 1).point(lambda _: 0)
        return orig(img, int(bits_to_keep), **kwargs)

    patch("shim_pillow13_posterize", raa, "posterize", posterize)
    for key, fn in list(raa.NAME_TO_OP.items()):
        if fn is orig:
            patch("shim_pillow13_posterize", raa.NAME_TO_OP, key, posterize)
