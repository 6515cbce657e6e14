"""The bundled demo: a module and the synthetic data it trains on."""

from ktrainer.demos.classifier import DemoClassifier, make_classification

__all__ = ["DemoClassifier", "make_classification"]
