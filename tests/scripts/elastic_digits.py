"""The elastic digits examples under a test tag: ``elastic_digits.py TAG
FRAMEWORK ARGS...`` runs examples/pytorch_elastic_digits.py (FRAMEWORK
``torch``) or examples/keras_elastic_digits.py (``keras``; tf_keras with
TF_USE_LEGACY_KERAS=1) with ARGS.  The tag in the command line lets the
multi-host tests find every process of the job on every host."""
import os
import runpy
import sys

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
SCRIPTS = {"torch": "pytorch_elastic_digits.py", "keras": "keras_elastic_digits.py"}

if __name__ == "__main__":
    example = os.path.join(EXAMPLES, SCRIPTS[sys.argv[2]])
    sys.path.insert(0, EXAMPLES)
    sys.argv = [example] + sys.argv[3:]
    runpy.run_path(example, run_name="__main__")
