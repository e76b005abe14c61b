__version__ = "0.1.0"
# DeepSpeed's top-level version names (`deepspeed.__version_major__`, ...): the parts of __version__ as integers.
__version_major__, __version_minor__, __version_patch__ = (int(part) for part in __version__.split(".")[:3])
# DeepSpeed records the commit and branch it was built from; dstrain is not a DeepSpeed build (git_version_info).
__git_hash__ = "[none]"
__git_branch__ = "[none]"
