__version__ = "0.1.0"

# The DeepSpeed release whose API dstrain serves (its documentation is dstrain's specification). The `deepspeed`
# distribution this package announces carries it, with dstrain's version as the local label.
DEEPSPEED_API_VERSION = "0.19.8"
