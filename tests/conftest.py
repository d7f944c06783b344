import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu may be installed for AOT compiles
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
