"""The hot-path profile names no folder of the machine that ran it (runs on CPU)."""

import os
import re

import torch
from profile_hot_path import ROOT, _path_labels, portable_paths, profile_text

from graphmodule import CudaGraphModule


def test_longest_folder_wins_and_the_repository_becomes_relative():
    labels = {"/src/repo/": "", "/src/repo/.venv/lib/python3.12/site-packages/": "<site-packages>/"}
    text = (
        "  20000  0.071  /src/repo/.venv/lib/python3.12/site-packages/torch/cuda/graphs.py:137(replay)\n"
        "  20000  0.019  /src/repo/graphmodule/_module.py:264(_run)\n"
        "  20000  0.002  {built-in method builtins.len}"
    )
    assert portable_paths(text, labels) == (
        "  20000  0.071  <site-packages>/torch/cuda/graphs.py:137(replay)\n"
        "  20000  0.019  graphmodule/_module.py:264(_run)\n"
        "  20000  0.002  {built-in method builtins.len}"
    )


def test_this_machines_folders_are_labelled():
    labels = _path_labels()
    assert os.sep not in labels  # never the file system's root
    assert labels[ROOT + os.sep] == ""
    torch_dir = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    assert portable_paths(os.path.abspath(torch.__file__)) == "<site-packages>/torch/__init__.py"
    assert portable_paths(os.path.abspath(os.__file__)) == "<stdlib>/os.py"
    assert torch_dir + os.sep in labels


def test_a_real_profile_names_no_absolute_folder():
    g = CudaGraphModule(lambda x: torch.nn.functional.relu(x) + 1, warmup=1, backend="simulate")
    x = torch.zeros(4)
    g(x)
    g(x)
    text = profile_text(g, (x,), 200, top=60)
    assert re.search(r"\sgraphmodule/\w+\.py:\d+\(", text), text  # the package, relative
    assert "<site-packages>/torch/nn/functional.py:" in text, text
    assert not re.search(r"\s/\S", text), text  # no absolute path left
    assert ROOT not in text
