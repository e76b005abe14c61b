"""Two things pyproject.toml cannot say: the wheel carries `dstrain_deepspeed_compat.pth` at the top of
site-packages (it starts the `import deepspeed` hook in every Python of the environment), and the build refuses
to make a wheel for an environment that holds a real DeepSpeed (this runs in the target interpreter, under pip's
build isolation too, so its site directories are the ones the wheel would go to)."""

import os
import site
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
from dstrain_deepspeed_compat.real_deepspeed import refusal, trace_in

HOOK = "dstrain_deepspeed_compat.pth"
ALLOW_ENV = "DSTRAIN_COMPAT_BUILD_ANYWHERE"  # "1": build a wheel to install elsewhere, whatever is installed here


def _target_site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    dirs = [paths["purelib"], paths["platlib"]]
    if site.ENABLE_USER_SITE is not False:
        dirs.append(site.getusersitepackages())
    return list(dict.fromkeys(dirs))


if os.environ.get(ALLOW_ENV) != "1":
    real = trace_in(_target_site_dirs())
    if real is not None:
        sys.exit(f"error: {refusal(real, 'pip install dstrain-deepspeed-compat')}. Nothing was installed "
                 f"({ALLOW_ENV}=1 builds the wheel anyway, to install in another environment)")


class BuildWithHook(build_py):
    def run(self):
        super().run()
        self.copy_file(HOOK, os.path.join(self.build_lib, HOOK))


setup(cmdclass={"build_py": BuildWithHook})
