import os

from setuptools import setup

# Adapter packages are listed only once they exist in the tree.
PACKAGE_DIRS = {
    "hvdlite": "hvdlite",
    "hvdlite.common": "hvdlite/common",
    "hvdlite.elastic": "hvdlite/elastic",
    "hvdlite.torch": "hvdlite/torch",
    "hvdlite.tensorflow": "hvdlite/tensorflow",
    "hvdlite.tensorflow.keras": "hvdlite/tensorflow/keras",
    "hvdlite.keras": "hvdlite/keras",
    "hvdlite.launcher": "launcher",
    "hvdlite.bench": "bench",
}
PACKAGES = [p for p, d in PACKAGE_DIRS.items() if os.path.exists(os.path.join(d, "__init__.py"))]

setup(
    name="hvdlite",
    version="0.1.0",
    description="Data-parallel training with a C++ engine over MPI; Horovod's API for torch and TensorFlow",
    long_description=open("README.md").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=PACKAGES,
    package_dir={p: PACKAGE_DIRS[p] for p in PACKAGES if p in ("hvdlite.launcher", "hvdlite.bench")},
    setup_requires=["cffi>=1.16"],
    cffi_modules=["build_engine.py:ffibuilder"],
    install_requires=["numpy>=1.23", "cffi>=1.16", "mpi4py>=3.1", "mpich"],
    extras_require={
        "test": ["pytest>=7", "scikit-learn"],
        "torch": ["torch>=2.1"],
        "tensorflow": ["tensorflow-cpu>=2.16"],
        "bench": ["matplotlib"],
    },
    entry_points={"console_scripts": ["hvdrun = hvdlite.launcher.__main__:main"]},
    zip_safe=False,
)
