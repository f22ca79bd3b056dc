"""The kernels (join, overlay), their plans and the CLI. ``from app.kernel import profile`` is the
notebook entry point; it is imported on first use so ``python -m app.kernel`` starts fast."""


def __getattr__(name):
    if name in ("profile", "ProfileResult"):
        from app.kernel import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'app.kernel' has no attribute {name!r}")
