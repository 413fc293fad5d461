"""A Tier for tests: entries in a dict, validated on put, counting its calls."""

from tiled.errors import CacheWriteError


class DictTier:
    """Like the real tiers, a put never replaces an entry: the first complete one wins.
    `fail_puts` makes every put raise CacheWriteError (a full disk)."""

    def __init__(self, name="dict", fail_puts=False):
        self.name, self.fail_puts = name, fail_puts
        self.entries, self.gets, self.puts = {}, 0, 0

    def get(self, key):
        self.gets += 1
        return self.entries.get(key)

    def put(self, entry):
        self.puts += 1
        if self.fail_puts:
            raise CacheWriteError("disk full")
        entry.validate()
        self.entries.setdefault(entry.key, entry)

    def contains(self, key):
        return key in self.entries

    def delete(self, key):
        return self.entries.pop(key, None) is not None

    def keys(self):
        return list(self.entries)
