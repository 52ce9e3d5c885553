"""The database backend: SQLite, PostgreSQL and MySQL/MariaDB."""

from .queue import DatabaseJobQueue, PgJobQueue
from .store import DatabaseUnavailable

__all__ = ["DatabaseJobQueue", "DatabaseUnavailable", "PgJobQueue"]
