"""`deepspeed.runtime.data_pipeline`: data efficiency's module paths (curriculum learning, data sampling and
analysis, random-LTD), each served by dsdata, the optional library that implements them (`pip install dsdata`)."""
