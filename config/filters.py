"""Query-string filters shared by the list endpoints."""

from __future__ import annotations

import datetime as dt

import django_filters
from django.core.exceptions import ValidationError
from django.utils import timezone
from django_filters.fields import IsoDateTimeField


class UtcDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, converted to UTC.

    PostgreSQL refuses an offset past ±15:59 and Python a date past year 9999 or before year 1
    once the offset is applied, so ``9999-12-31T23:59:59-23:59`` is refused here, as a 400 naming
    the parameter, instead of failing in the query."""

    default_error_messages = {
        "out_of_range": "must be between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z "
        "once converted to UTC",
    }

    def to_python(self, value):
        result = super().to_python(value)
        if result is None or timezone.is_naive(result):
            return result
        try:
            return result.astimezone(dt.UTC)
        except OverflowError:
            raise ValidationError(
                self.error_messages["out_of_range"], code="out_of_range"
            ) from None


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    """``IsoDateTimeFilter`` whose value is in UTC and always one PostgreSQL can compare."""

    field_class = UtcDateTimeField
