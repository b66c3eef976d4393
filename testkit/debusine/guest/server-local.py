"""hugify's test instance of debusine (testkit/debusine): the packaged production settings
(selected.py) with the instance's name and its Redis on the instance's loopback address."""

from .defaults import CHANNEL_LAYERS
from .selected import *  # noqa: F403

DEBUSINE_FQDN = "@FQDN@"
DEBUSINE_DEBIAN_ARCHIVE_FQDN = "deb.@FQDN@"
DEBUSINE_CONTACT_EMAIL = "owner@@FQDN@"

CELERY_BROKER_URL = "redis://@ADDRESS@:6379/0"
PROMETHEUS_REDIS_URL = "redis://@ADDRESS@:6379/1"
LIVE_LOG_REDIS_URL = "redis://@ADDRESS@:6379/2"
CHANNEL_LAYERS = CHANNEL_LAYERS.copy()
CHANNEL_LAYERS["default"]["CONFIG"] = {"hosts": ["redis://@ADDRESS@:6379"]}
