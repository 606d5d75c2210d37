"""Programs run under torchrun by ``tests/test_distributed.py``: ``launch`` starts them with a
time limit, ``worker`` is the program each process runs."""
