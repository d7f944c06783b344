import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu may be installed for AOT compiles
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # parallel test workers share libtpu
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
