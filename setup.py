import importlib.util
import os
import shutil

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

# Adapter packages are listed only once they exist in the tree.
PACKAGE_DIRS = {
    "hvdlite": "hvdlite",
    "hvdlite.common": "hvdlite/common",
    "hvdlite.elastic": "hvdlite/elastic",
    "hvdlite.torch": "hvdlite/torch",
    "hvdlite_torch_plugin": "torch_plugin",
    "hvdlite.tensorflow": "hvdlite/tensorflow",
    "hvdlite.tensorflow.keras": "hvdlite/tensorflow/keras",
    "hvdlite.keras": "hvdlite/keras",
    "hvdlite.launcher": "launcher",
    "hvdlite.bench": "bench",
}
PACKAGES = [p for p, d in PACKAGE_DIRS.items() if os.path.exists(os.path.join(d, "__init__.py"))]


def _tf_op_library():
    """hvdlite/tensorflow/op_library.py, loaded from its path: hvdlite itself
    cannot be imported before its engine is built."""
    spec = importlib.util.spec_from_file_location(
        "_hvdlite_op_library", os.path.join("hvdlite", "tensorflow", "op_library.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildExtWithTensorFlowOps(build_ext):
    """Builds the engine, then the TensorFlow op library when TensorFlow is
    importable (otherwise hvdlite.tensorflow builds it on first import)."""

    def run(self):
        super().run()
        if importlib.util.find_spec("tensorflow") is None:
            self.announce("TensorFlow not installed: hvdlite.tensorflow builds its op library "
                          "on first import", level=2)
            return
        package_dir = os.path.join("hvdlite", "tensorflow", "ops")
        target = package_dir if self.inplace else os.path.join(self.build_lib, package_dir)
        os.makedirs(target, exist_ok=True)
        library = _tf_op_library()
        try:
            self.announce(f"building the TensorFlow op library into {target}", level=2)
            # No lock here (one build process); the name says which TF it is for.
            library.compile_library(os.path.join(target, library.library_name()))
        except library.BuildError as e:
            self.warn(f"the TensorFlow op library was not built ({e}); hvdlite.tensorflow "
                      "tries again on first import")


class BuildPyWithCApiHeader(build_py):
    """Installs csrc/api/c_api.h as hvdlite/include/c_api.h: an op library built
    on first import (TensorFlow installed after hvdlite) compiles against it."""

    def run(self):
        super().run()
        include = os.path.join(self.build_lib, "hvdlite", "include")
        os.makedirs(include, exist_ok=True)
        shutil.copyfile(os.path.join("csrc", "api", "c_api.h"), os.path.join(include, "c_api.h"))

setup(
    name="hvdlite",
    version="0.1.0",
    description="Data-parallel training with a C++ engine over MPI; Horovod's API for torch and TensorFlow",
    long_description=open("README.md").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=PACKAGES,
    package_dir={p: PACKAGE_DIRS[p] for p in PACKAGES
                 if p in ("hvdlite.launcher", "hvdlite.bench", "hvdlite_torch_plugin")},
    package_data={"hvdlite.tensorflow": ["ops/*.cc", "ops/*.h"]},
    cmdclass={"build_ext": BuildExtWithTensorFlowOps, "build_py": BuildPyWithCApiHeader},
    setup_requires=["cffi>=1.16"],
    cffi_modules=["build_engine.py:ffibuilder"],
    # No MPI here: the engine builds against the MPI found at install time, the
    # mpich wheel (the "mpich" extra, installed before hvdlite) or your own.
    install_requires=["numpy>=1.23", "cffi>=1.16", "mpi4py>=3.1"],
    extras_require={
        "mpich": ["mpich"],
        "test": ["pytest>=7", "scikit-learn", "pyyaml"],
        "torch": ["torch>=2.1"],
        "tensorflow": ["tensorflow-cpu>=2.16"],
        "bench": ["matplotlib"],
    },
    entry_points={"console_scripts": ["hvdrun = hvdlite.launcher.__main__:main"],
                  # torch imports these with itself: the "hvdlite" torch.distributed backend
                  "torch.backends": ["hvdlite = hvdlite_torch_plugin:autoload"]},
    zip_safe=False,
)
