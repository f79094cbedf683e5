"""SFT and RL data from verified conversations, and the files TRL, LlamaFactory and VeRL read.

`convert_to_sft_data` / `convert_to_rl_data` follow the EnvFactory reference (section 3.5); the writers
(`trl_sft`, `trl_grpo`, `llamafactory`, `verl`) import datasets/pyarrow only when they run.
"""

from envfactory.export.chat_template import ChatTemplateSetup, ensure_chat_template, tool_chat_template
from envfactory.export.errors import ExportError
from envfactory.export.export import FORMATS, ExportFormat, ExportReport, export_conversations
from envfactory.export.files import load_conversations
from envfactory.export.messages import ChatMessage, ChatToolCall, FunctionCall
from envfactory.export.options import ExportOptions
from envfactory.export.rl import GroundTruthCall, RLSample, convert_to_rl_data
from envfactory.export.sft import SFTSample, convert_to_sft_data
from envfactory.export.tools_schema import Catalog, ToolNamer, ToolSchema, catalog_from_pool, conversation_tools

__all__ = [
    "FORMATS",
    "Catalog",
    "ChatMessage",
    "ChatTemplateSetup",
    "ChatToolCall",
    "ExportError",
    "ExportFormat",
    "ExportOptions",
    "ExportReport",
    "FunctionCall",
    "GroundTruthCall",
    "RLSample",
    "SFTSample",
    "ToolNamer",
    "ToolSchema",
    "catalog_from_pool",
    "conversation_tools",
    "convert_to_rl_data",
    "convert_to_sft_data",
    "ensure_chat_template",
    "export_conversations",
    "load_conversations",
    "tool_chat_template",
]
