"""structlens: identifiable mechanistic interpretability.

Structure that a transformer determines itself, with error bars, rather than structure that a
discovery procedure happens to produce.
"""

__version__ = "0.1.0"
