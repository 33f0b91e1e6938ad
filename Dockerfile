FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
# The runtime set only (requirements.lock): no test tools or linters (those are in
# requirements-dev.lock, for the dev venv), and not the CLI (cli/ is not installed here).
COPY requirements.lock .
RUN pip install --no-cache-dir -r requirements.lock
COPY . .
# Static files (the admin's, DRF's browsable API's) collected at build, a gzip copy beside each,
# and served by gunicorn from there (WhiteNoise; config/settings.py). Outside var/, so a volume
# mounted there does not hide them.
ENV STATIC_ROOT=/app/static MANTA_STATIC_COLLECTED=true
RUN DJANGO_SETTINGS_MODULE=config.settings python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["gunicorn", "config.wsgi", "-b", "0.0.0.0:8000", "-w", "4"]
