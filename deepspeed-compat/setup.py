"""Two things pyproject.toml cannot say: the wheel carries `dstrain_deepspeed_compat.pth` at the top of
site-packages (it starts the `import deepspeed` hook in every Python of the environment), and the build refuses
to make a wheel for an environment that holds a real DeepSpeed (this runs in the target interpreter, under pip's
build isolation too, so its site directories are the ones the wheel would go to)."""

import importlib.util
import os
import site
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py


def _load_checks():
    """This checkout's real_deepspeed.py, by its path: an installed copy of this package (an upgrade) is
    imported already, by its own start-up hook, and may be older."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "dstrain_deepspeed_compat",
                        "real_deepspeed.py")
    spec = importlib.util.spec_from_file_location("_dstrain_deepspeed_compat_build_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_checks = _load_checks()
installed_in, refusal = _checks.installed_in, _checks.refusal

HOOK = "dstrain_deepspeed_compat.pth"
ALLOW_ENV = "DSTRAIN_COMPAT_BUILD_ANYWHERE"  # "1": build a wheel to install elsewhere, whatever is installed here


def _target_site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    dirs = [paths["purelib"], paths["platlib"]]
    if site.ENABLE_USER_SITE is not False:
        dirs.append(site.getusersitepackages())
    return list(dict.fromkeys(dirs))


if os.environ.get(ALLOW_ENV) != "1":
    real = installed_in(_target_site_dirs(), packages=True)
    if real is not None:
        sys.exit(f"error: {refusal(real, 'pip install dstrain-deepspeed-compat')}. Nothing was installed "
                 f"({ALLOW_ENV}=1 builds the wheel anyway, to install in another environment)")


class BuildWithHook(build_py):
    def run(self):
        super().run()
        self.copy_file(HOOK, os.path.join(self.build_lib, HOOK))


setup(cmdclass={"build_py": BuildWithHook})
