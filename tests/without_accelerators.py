"""A pytest plugin (``make test-plain``): simplejpeg and ISA-L made unimportable before packer is
imported, as on a platform where they have no wheels, so that the tests run packer's Pillow and
zlib paths."""

import sys

for _name in ("simplejpeg", "isal", "isal.isal_zlib"):
    sys.modules[_name] = None  # type: ignore[assignment]  # import now raises ImportError
