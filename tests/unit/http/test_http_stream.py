"""The WebSocket stream's sentence splitter: pieces of text in, complete sentences out as early as they are sure."""

from __future__ import annotations

from stagevisor.supervisor.http.stream import SentenceSplitter


def test_a_sentence_is_released_once_the_text_after_its_end_has_started():
    splitter = SentenceSplitter()
    assert splitter.push("Hello th") == []
    assert splitter.push("ere.") == []  # "there.5" or "there. Next" are still possible
    assert splitter.push(" How") == ["Hello there."]
    assert splitter.push(" are you? I") == ["How are you?"]
    assert splitter.flush() == ["I"] and splitter.flush() == []


def test_newlines_and_closing_quotes_end_sentences():
    splitter = SentenceSplitter()
    assert splitter.push('He said "stop." Then\nthe end') == ['He said "stop."', "Then"]
    assert splitter.flush() == ["the end"]


def test_a_run_on_text_is_cut_at_a_space_once_it_is_long():
    splitter = SentenceSplitter(max_chars=20)
    assert splitter.push("one two three four five six") == ["one two three four"]
    assert splitter.flush() == ["five six"]


def test_a_decimal_number_is_not_a_sentence_end():
    splitter = SentenceSplitter()
    assert splitter.push("It costs 3.5 dollars. And") == ["It costs 3.5 dollars."]


def test_a_piece_with_no_letter_or_digit_is_not_a_sentence():
    splitter = SentenceSplitter()
    assert splitter.push("Great job! \U0001f642. --- ... Next 2. And") == ["Great job!", "Next 2."]
    assert splitter.flush() == ["And"]
    assert splitter.push("\u4f60\u597d\u3002 ok") == ["\u4f60\u597d\u3002"]  # letters of any script are letters
    assert splitter.flush() == ["ok"]
    assert splitter.push("\U0001f642\U0001f642") == [] and splitter.flush() == []
