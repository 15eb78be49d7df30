"""The frameworks' own log words the suite looks for in a cell's stderr, written once: the run keeps the lines about
a half-precision path (harness/run/runner.py), the profiler tees the Eigen fallback (kit/profile.py) and the report
quotes oneDNN's DT_HALF line (harness/report/speed.py, hardware.py)."""

# TensorFlow on a CPU without AVX-512 FP16, in its fp16 cells' stderr: "oneDNN supports DT_HALF only on platforms
# with AVX-512. Falling back to the default Eigen-based implementation …"
HALF_FALLBACK = "oneDNN supports DT_HALF only on platforms with AVX-512"
EIGEN_FALLBACK = "Falling back to the default Eigen-based implementation"
# A line about the half-precision path names a half format and a fallback or a support limit.
HALF_WORDS = ("DT_HALF", "DT_BFLOAT16", "float16", "bfloat16", "Half", "BFloat16")
PATH_WORDS = ("alling back", "supports", "not supported", "unsupported", "only on")
