from apps.gateway import sse


def test_splitter_holds_partial_events_across_chunks():
    splitter = sse.EventSplitter()
    stream = b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    events = []
    for i in range(0, len(stream), 7):  # arbitrary cut points, mid-event and mid-separator
        events.extend(splitter.feed(stream[i : i + 7]))
    assert events == [b'data: {"a": 1}', b'data: {"b": 2}', b"data: [DONE]"]


def test_data_of():
    assert sse.data_of(b"data: [DONE]") == sse.DONE
    assert sse.data_of(b'data:{"x":1}') == b'{"x":1}'
    assert sse.data_of(b": keep-alive") is None
    assert sse.encode(b"{}") == b"data: {}\n\n"
