"""``hugify try -- COMMAND``: whether hugified code makes one command faster on this
machine, measured without changing the system (docs/try.md).

One module per part, used in this order by `session`:

* ``sides``: the two private mount namespaces the runs go in, the hugified copies
  bind-mounted over the originals' paths in one of them;
* ``discover``: the first run, and every ELF object its processes loaded;
* ``cache``: the hugified copies, made like a package build makes them and kept by
  the originals' content;
* ``pagecache``: the files under test in the page cache as each side needs them;
* ``watch``: what each run's processes mapped, from /proc;
* ``session``: the comparison (hugify.abtest orders the runs and computes the figures);
* ``report``: the answer as text, JSON and pictures;
* ``ways``: the same comparison with any number of ways side by side in one run
  (bench/speedup.py --ways: hugify's two, the peers', glibc's advice).
"""
