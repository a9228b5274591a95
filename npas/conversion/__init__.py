"""Conversion: a trained model mapped into any allocation of its chassis, every tensor derived from it.

`convert_model` works on modules; `convert_dir` reads a `npas train` directory and writes one.
"""

from npas.conversion.convert import Conversion, convert_model, convertible_problems

__all__ = ["Conversion", "convert_model", "convertible_problems"]
