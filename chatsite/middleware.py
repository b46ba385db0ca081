from django.middleware.gzip import GZipMiddleware
from django.utils.deprecation import MiddlewareMixin

from chatsite.error_pages import unavailable_response


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


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """A view that fails because the database cannot be reached answers 503 with
    ``Retry-After``, never 500 (issue 26; core/unavailable.py says which errors those are).

    Rendered for whoever asked: ``/v1`` gets the API's JSON error, an htmx request from a page
    gets no swap and a ``chat:unavailable`` event whose message the page shows above the message
    box (static/chat/layout.js; what the person typed stays in the box), any other page the
    site's own 503 page (chatsite/error_pages.py). Errors raised by other middleware, before a
    view ran, reach the 500 handler, which answers the same way.
    """

    def process_exception(self, request, exception):
        return unavailable_response(request, exception)
