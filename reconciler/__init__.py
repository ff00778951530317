"""nftrec: kube-proxy's nftables mode without Kubernetes."""


__version__ = "0.1.0"  # the one place; pyproject.toml reads it (tool.setuptools.dynamic)


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]):
    """(`__all__`, `__getattr__`) for a stage package: {submodule: names other stages use}.

    A name's submodule is imported on first use (PEP 562), so `nftrec status` does not
    pay for the YAML and JSON Schema libraries that only intake needs. No exported name
    may equal a submodule's name (Python would hand out the module instead), nor be listed
    by two submodules (one would silently shadow the other).
    """
    import importlib

    where = {name: module for module, names in exports.items() for name in names}
    clash = sorted(set(where) & set(exports))
    if clash:
        raise ImportError(f"{package}: exported names equal submodule names: {clash}")
    twice = sorted(n for n in where if sum(n in names for names in exports.values()) > 1)
    if twice:
        raise ImportError(f"{package}: names exported by two submodules: {twice}")

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return sorted(where), __getattr__
