"""``ramstream demo`` and its data: the shipped agents lab and synthetic families (``samples``).
Imported only by the ``demo`` command, the tests and the benchmarks, never by the library."""
