from django.middleware.gzip import GZipMiddleware


class GZipExceptEventStreamMiddleware(GZipMiddleware):
    """Django's GZip middleware, minus ``text/event-stream`` responses (and already compressed
    downloads: zip archives, PDFs).

    A compressor holds bytes back until it has a block worth emitting, so a gzipped event
    stream reaches the client late or all at once (PEER-FAULTS PF-S3). Pages still compress.
    """

    # Already compressed: gzip would only cost CPU and drop Content-Length (data exports).
    PASS_THROUGH = ("text/event-stream", "application/zip", "application/pdf")

    def process_response(self, request, response):
        if response.get("Content-Type", "").startswith(self.PASS_THROUGH):
            return response
        return super().process_response(request, response)
