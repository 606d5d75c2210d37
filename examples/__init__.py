"""Runnable examples (``python examples/NAME.py --help``); ``examples.common`` holds what they share."""
