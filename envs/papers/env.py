"""Papers: a literature library to search papers, follow citations and authors, keep reading lists and notes."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from envfactory.env import ConflictError, Environment, Record, State, ToolError

MAX_NOTE_CHARS = 2000


class Author(Record):
    id: str
    name: str
    affiliation: str
    h_index: int


class Paper(Record):
    id: str
    title: str
    author_ids: list[str]
    year: int
    venue: str
    abstract: str
    keywords: list[str] = Field(default_factory=list)
    references: list[str] = Field(default_factory=list)  # ids of the library's papers this paper cites


class ReadingList(Record):
    id: str
    name: str
    paper_ids: list[str] = Field(default_factory=list)
    created_at: datetime


class Note(Record):
    id: str
    paper_id: str
    text: str
    created_at: datetime


class PaperSummary(Record):
    id: str
    title: str
    year: int
    venue: str
    author_ids: list[str]


class PaperDetails(Record):
    id: str
    title: str
    author_ids: list[str]
    year: int
    venue: str
    abstract: str
    keywords: list[str]
    references: list[str]
    cited_by_count: int
    notes: list[Note]


class AuthorProfile(Record):
    id: str
    name: str
    affiliation: str
    h_index: int
    paper_ids: list[str]


class PapersDB(State):
    authors: dict[str, Author] = Field(default_factory=dict)
    papers: dict[str, Paper] = Field(default_factory=dict)
    reading_lists: dict[str, ReadingList] = Field(default_factory=dict)
    notes: dict[str, Note] = Field(default_factory=dict)


env = Environment(
    "papers",
    PapersDB,
    description=(
        "Research literature library: search papers by keywords and year, read details, follow citations "
        "and authors, organize papers into reading lists and keep notes on them."
    ),
    domain="research",
)


def _summary(p: Paper) -> PaperSummary:
    return PaperSummary(**p.model_dump(include=set(PaperSummary.model_fields)))


def _newest_first(papers: list[Paper]) -> list[PaperSummary]:
    return [_summary(p) for p in sorted(papers, key=lambda p: (-p.year, p.id))]


def _cited_by(db: PapersDB, paper_id: str) -> list[Paper]:
    return [p for p in db.papers.values() if paper_id in p.references]


@env.tool(kind="read")
def search_papers(
    db: PapersDB, query: str, year_from: int | None = None, year_to: int | None = None
) -> list[PaperSummary]:
    """Search papers whose title, abstract or keywords contain every word of a query, newest first.

    Args:
        query: Words to look for, e.g. "vision transformer" (case-insensitive; all must appear).
        year_from: Earliest publication year to include.
        year_to: Latest publication year to include.
    """
    words = query.lower().split()
    if not words:
        raise ToolError("query must contain at least one word")
    if year_from is not None and year_to is not None and year_from > year_to:
        raise ToolError(f"year_from ({year_from}) is after year_to ({year_to})")
    found = []
    for p in db.papers.values():
        text = " ".join([p.title, p.abstract, *p.keywords]).lower()
        if (
            all(w in text for w in words)
            and (year_from is None or p.year >= year_from)
            and (year_to is None or p.year <= year_to)
        ):
            found.append(p)
    return _newest_first(found)


@env.tool(kind="read")
def get_paper(db: PapersDB, paper_id: str) -> PaperDetails:
    """Get a paper's full record: authors, venue, abstract, references, how often it is cited, and your notes on it.

    Args:
        paper_id: Id of the paper, as returned by search_papers.
    """
    paper = db.get("papers", paper_id, "paper")
    return PaperDetails(
        **paper.model_dump(),
        cited_by_count=len(_cited_by(db, paper_id)),
        notes=db.find("notes", paper_id=paper_id),
    )


@env.tool(kind="read")
def get_citations(
    db: PapersDB, paper_id: str, direction: Literal["cited_by", "references"] = "cited_by"
) -> list[PaperSummary]:
    """List the library's papers that cite a paper ("cited_by") or that the paper cites ("references"), newest first.

    Args:
        paper_id: Id of the paper.
        direction: "cited_by" for papers citing it, "references" for papers it cites.
    """
    paper = db.get("papers", paper_id, "paper")
    if direction == "cited_by":
        return _newest_first(_cited_by(db, paper_id))
    return _newest_first([db.papers[r] for r in paper.references if r in db.papers])


@env.tool(kind="read")
def get_author(db: PapersDB, author_id: str) -> AuthorProfile:
    """Get an author's profile: affiliation, h-index and the ids of their papers in the library.

    Args:
        author_id: Id of the author, from a paper's author_ids.
    """
    author = db.get("authors", author_id, "author")
    papers = sorted((p for p in db.papers.values() if author_id in p.author_ids), key=lambda p: (-p.year, p.id))
    return AuthorProfile(**author.model_dump(), paper_ids=[p.id for p in papers])


@env.tool(kind="read")
def list_reading_lists(db: PapersDB) -> list[ReadingList]:
    """List all reading lists with the ids of the papers on them."""
    return list(db.reading_lists.values())


@env.tool(kind="write")
def create_reading_list(db: PapersDB, name: str) -> ReadingList:
    """Create a new, empty reading list; list names are unique (case-insensitive).

    Args:
        name: Name of the list, e.g. "Thesis background".
    """
    name = name.strip()
    if not name:
        raise ToolError("name must not be empty")
    for rl in db.reading_lists.values():
        if rl.name.lower() == name.lower():
            raise ConflictError(f"a reading list named '{rl.name}' already exists ({rl.id})")
    rl = ReadingList(id=db.new_id("RL"), name=name, created_at=db.now())
    return db.create("reading_lists", rl.id, rl)


@env.tool(kind="write")
def add_to_reading_list(db: PapersDB, list_id: str, paper_id: str) -> ReadingList:
    """Add a paper to the end of a reading list.

    Args:
        list_id: Id of the reading list, as returned by create_reading_list or list_reading_lists.
        paper_id: Id of the paper to add.
    """
    rl = db.get("reading_lists", list_id, "reading list")
    db.get("papers", paper_id, "paper")
    if paper_id in rl.paper_ids:
        raise ConflictError(f"paper {paper_id} is already on reading list '{rl.name}'")
    return db.update("reading_lists", list_id, paper_ids=[*rl.paper_ids, paper_id])


@env.tool(kind="write")
def remove_from_reading_list(db: PapersDB, list_id: str, paper_id: str) -> ReadingList:
    """Remove a paper from a reading list.

    Args:
        list_id: Id of the reading list.
        paper_id: Id of the paper to remove.
    """
    rl = db.get("reading_lists", list_id, "reading list")
    if paper_id not in rl.paper_ids:
        raise ConflictError(f"paper {paper_id} is not on reading list '{rl.name}'")
    return db.update("reading_lists", list_id, paper_ids=[p for p in rl.paper_ids if p != paper_id])


@env.tool(kind="write")
def add_note(db: PapersDB, paper_id: str, text: str) -> Note:
    """Attach a private note to a paper (at most 2000 characters).

    Args:
        paper_id: Id of the paper the note is about.
        text: The note's text.
    """
    db.get("papers", paper_id, "paper")
    text = text.strip()
    if not text:
        raise ToolError("text must not be empty")
    if len(text) > MAX_NOTE_CHARS:
        raise ToolError(f"a note holds at most {MAX_NOTE_CHARS} characters, got {len(text)}")
    note = Note(id=db.new_id("NT"), paper_id=paper_id, text=text, created_at=db.now())
    return db.create("notes", note.id, note)


@env.tool(kind="write")
def delete_note(db: PapersDB, note_id: str) -> Note:
    """Delete a note; returns the deleted note.

    Args:
        note_id: Id of the note, as returned by add_note or shown in get_paper's notes.
    """
    db.get("notes", note_id, "note")
    return db.delete("notes", note_id)
