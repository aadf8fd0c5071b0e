"""Drawing: the self-contained HTML report and its charts."""
