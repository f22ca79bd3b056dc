"""The kernels (join, overlay), their plans and the CLI. ``from app.kernel import profile`` is the
notebook entry point; it is imported on first use so ``python -m app.kernel`` starts fast."""

# The notebook's names, loaded on first use (__getattr__) and listed by dir(app.kernel) and tab completion.
_LAZY = ("profile", "ProfileResult")


def __getattr__(name):
    if name in _LAZY:
        from app.kernel import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'app.kernel' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
