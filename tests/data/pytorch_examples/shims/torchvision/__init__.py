"""A stand-in for the few parts of torchvision that dcgan/main.py uses with ``--dataset fake`` (torchvision is
not a dependency of this project): written here for the attach-mode corpus, not torchvision's code. On
PYTHONPATH only for that test."""
