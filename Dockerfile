# notifkit, any role: the command line picks the services (python -m notifkit serve --services ...).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    LOG_FORMAT=json

WORKDIR /app
COPY pyproject.toml README.md ./
COPY notifkit ./notifkit
COPY simulators ./simulators
COPY scenarios ./scenarios
RUN pip install '.[fast,fcm]' && useradd --system --uid 10001 notifkit
USER notifkit

EXPOSE 8080
ENTRYPOINT ["python", "-m", "notifkit"]
CMD ["serve"]
