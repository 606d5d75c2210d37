"""The public surface: ``__all__`` is honest and the docstring examples run."""

import doctest

import graphmodule
from graphmodule import _hookdicts, _hookeffects, _hooks, _module, _stats


def test_all_names_exist_and_nothing_private_is_exported():
    for name in graphmodule.__all__:
        assert hasattr(graphmodule, name), name
    public = {n for n in dir(graphmodule) if not n.startswith("_")}
    assert public == set(graphmodule.__all__) - {"__version__"}


def test_errors_subclass_the_builtins_users_catch():
    assert issubclass(graphmodule.InputMismatchError, ValueError)
    assert issubclass(graphmodule.RequiresGradError, ValueError)
    assert issubclass(graphmodule.RequiresGradError, RuntimeError)
    assert issubclass(graphmodule.CaptureError, RuntimeError)
    assert issubclass(graphmodule.GraphStateError, RuntimeError)
    for name in ("InputMismatchError", "CaptureError", "GraphStateError"):
        assert issubclass(getattr(graphmodule, name), graphmodule.GraphModuleError)


def test_docstring_examples_run():
    for module in (_hookdicts, _hookeffects, _hooks, _module, _stats):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__
