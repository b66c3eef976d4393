"""hugify: put the code of ELF programs and libraries on huge pages.

The rewriting itself lives in the Rust core (``hugify._core``); this package holds
the command line, the file-replacement protocol, and the packaging glue.
"""

from hugify._core import VERSION as __version__

__all__ = ["__version__"]
