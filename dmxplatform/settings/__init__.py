"""Django settings, one module per concern; every value comes from the environment."""

from dmxplatform.settings.accounts import *  # noqa: F403
from dmxplatform.settings.api import *  # noqa: F403
from dmxplatform.settings.audit import *  # noqa: F403
from dmxplatform.settings.base import *  # noqa: F403
from dmxplatform.settings.batches import *  # noqa: F403
from dmxplatform.settings.billing import *  # noqa: F403
from dmxplatform.settings.celery import *  # noqa: F403
from dmxplatform.settings.database import *  # noqa: F403
from dmxplatform.settings.fleet import *  # noqa: F403
from dmxplatform.settings.gateway import *  # noqa: F403
from dmxplatform.settings.logging import *  # noqa: F403
from dmxplatform.settings.observability import *  # noqa: F403
from dmxplatform.settings.redis import *  # noqa: F403
from dmxplatform.settings.routing import *  # noqa: F403
from dmxplatform.settings.scaling import *  # noqa: F403
