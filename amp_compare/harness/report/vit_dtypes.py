"""Where render.py imports it from: the ViT's table of computed dtypes lives in numerics.py."""
from amp_compare.harness.report.numerics import vit_dtype_table  # noqa: F401
