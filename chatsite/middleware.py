from django.middleware.gzip import GZipMiddleware


class GZipExceptEventStreamMiddleware(GZipMiddleware):
    """Django's GZip middleware, minus ``text/event-stream`` responses.

    A compressor holds bytes back until it has a block worth emitting, so a gzipped event
    stream reaches the client late or all at once (PEER-FAULTS PF-S3). Pages still compress.
    """

    def process_response(self, request, response):
        if response.get("Content-Type", "").startswith("text/event-stream"):
            return response
        return super().process_response(request, response)
