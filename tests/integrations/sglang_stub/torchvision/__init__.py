"""A stand-in for torchvision in the SGLang plugin's CPU test venv only (tests/integrations).

sglang.srt.layers imports torchvision (for its multimodal models) while it loads, and the
torchvision builds on PyPI need a CUDA torch: beside the CPU torch of the test venv they fail to
load. The plugin's layers never use torchvision. Every `torchvision.*` module is this package's
stand-in; using anything from it raises, naming the stub."""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+tiled-test-stub"


class _Absent:
    """Any attribute of a stand-in module: a placeholder that raises when used."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: torchvision is a stub in this test venv")

    def __repr__(self):
        return f"<torchvision stub {self._name}>"


def _module_getattr(module_name):
    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{module_name}.{attr}")
    return __getattr__


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubFinder())
__getattr__ = _module_getattr("torchvision")
