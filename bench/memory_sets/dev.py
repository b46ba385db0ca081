"""The tuning part of the labelled extraction set (see bench/memory_sets/__init__.py)."""

A = "Sure, here you go."

CONVERSATIONS = [
    # --- facts the user states about themselves -------------------------------------------
    {"id": "name-home", "turns": [
        ("Hi, my name is Ada and I live in Lyon.", "Nice to meet you, Ada! I live in the cloud myself."),
        ("What's a good bakery area to explore on a Sunday?", "Try the Croix-Rousse market."),
    ], "expect": [["ada"], ["lyon"]]},
    {"id": "vegetarian-recipe", "turns": [
        ("I'm vegetarian. Can you suggest a quick dinner?", "How about a chickpea curry? I love curry."),
    ], "expect": [["vegetarian"]]},
    {"id": "cat", "turns": [
        ("I have a grey cat called Pixel. How often should I brush her?", "Twice a week is plenty."),
    ], "expect": [["cat", "pixel"]]},
    {"id": "job-nurse", "turns": [
        ("I work as a nurse on night shifts.", "That must be demanding."),
        ("How can I sleep better during the day?", "Blackout curtains help."),
    ], "expect": [["nurse"]]},
    {"id": "learning-rust", "turns": [
        ("I'm learning Rust. What is a borrow checker?", "It enforces ownership rules at compile time."),
    ], "expect": [["rust"]]},
    {"id": "allergy", "turns": [
        ("I'm allergic to peanuts, so what snacks are safe on a plane?", "Pretzels or dried fruit, check labels."),
    ], "expect": [["peanut"]]},
    {"id": "daughters", "turns": [
        ("I have two daughters, aged 6 and 9.", "Lovely!"),
        ("Any board games for them?", "Ticket to Ride is a favourite."),
    ], "expect": [["two daughters"]]},
    {"id": "moved-berlin", "turns": [
        ("I just moved to Berlin for a new job.", "Congratulations! I hear Berlin is great."),
    ], "expect": [["berlin"]]},
    {"id": "prefers-short", "turns": [
        ("I prefer short answers, please.", "Understood."),
        ("What is the capital of Peru?", "Lima."),
    ], "expect": [["short answers"]]},
    {"id": "cello", "turns": [
        ("I play the cello in an amateur orchestra.", "How wonderful. I am a big fan of Bach."),
    ], "expect": [["cello"]]},
    {"id": "marathon-plan", "turns": [
        ("I'm training for the Paris marathon in April.", "Great goal."),
        ("How many long runs should I do per week?", "One long run a week is typical."),
    ], "expect": [["marathon"]]},
    {"id": "speaks", "turns": [
        ("I speak Portuguese and French, but my English is rusty.", "Your English looks fine!"),
    ], "expect": [["portuguese"]]},
    {"id": "age", "turns": [
        ("I'm 34 years old and want to start lifting weights.", "Start light and focus on form."),
    ], "expect": [["34"]]},
    {"id": "favourite-food", "turns": [
        ("My favourite food is ramen.", "Ramen is delicious."),
        ("Where did ramen come from?", "It came to Japan from China."),
    ], "expect": [["ramen"]]},
    {"id": "love-hiking", "turns": [
        ("I love hiking in the mountains.", "Me too, I love the Alps."),
    ], "expect": [["hiking"]]},
    {"id": "dog-name", "turns": [
        ("My dog is called Biscuit and he is a beagle.", "Biscuit is a great name."),
    ], "expect": [["biscuit"]]},
    {"id": "wife-name", "turns": [
        ("My wife's name is Maria. What should I get her for our anniversary?", "Flowers and a dinner."),
    ], "expect": [["maria"]]},
    {"id": "student", "turns": [
        ("I'm a student at the University of Leeds studying chemistry.", "Chemistry is fascinating."),
    ], "expect": [["chemistry"]]},
    {"id": "linux-user", "turns": [
        ("I use Linux at home and a Mac at work.", "Both are fine for development."),
    ], "expect": [["linux"]]},
    {"id": "trip-japan", "turns": [
        ("I'm planning a trip to Japan next spring.", "Cherry blossom season is beautiful."),
        ("What should I pack?", "Layers and comfortable shoes."),
    ], "expect": [["japan"]]},
    {"id": "diabetic", "turns": [
        ("I have type 2 diabetes. Is oatmeal a good breakfast?", "Steel-cut oats are a good choice."),
    ], "expect": [["diabetes"]]},
    {"id": "call-me", "turns": [
        ("Please call me Sam from now on.", "Will do, Sam."),
    ], "expect": [["sam"]]},
    {"id": "dislike-cilantro", "turns": [
        ("I hate cilantro. Give me a salsa recipe without it.", "Here is a salsa with parsley."),
    ], "expect": [["cilantro"]]},
    {"id": "two-facts-one-line", "turns": [
        ("I'm a teacher and I live in Toronto.", "Toronto is a great city."),
    ], "expect": [["teacher"], ["toronto"]]},
    {"id": "from-kenya", "turns": [
        ("I'm from Kenya, what are some winter tips for my first Canadian winter?", "Dress in layers."),
    ], "expect": [["kenya"]]},
    # --- nothing about the user -----------------------------------------------------------
    {"id": "essay-bicycles", "turns": [
        ("Write a short essay about the history of the bicycle.", "The bicycle was invented in 1817. I find it fascinating."),
    ], "expect": []},
    {"id": "translate-sentence", "turns": [
        ("Translate into Spanish: I live in Madrid and I have three brothers.", "Vivo en Madrid y tengo tres hermanos."),
    ], "expect": []},
    {"id": "translate-quoted", "turns": [
        ("How do you say \"I am a doctor\" in German?", "\"Ich bin Arzt.\""),
    ], "expect": []},
    {"id": "summarise-email", "turns": [
        ("Summarise this email: Hi team, I am moving to the Singapore office next month and I will miss you all. Best, Tom", "Tom is moving to Singapore next month."),
    ], "expect": []},
    {"id": "story-named", "turns": [
        ("Write a story about a girl named Lila who lives in a lighthouse.", "Lila lived in a lighthouse by the sea..."),
        ("Make her have a pet seagull.", "Lila's seagull was called Pip."),
    ], "expect": []},
    {"id": "pirate-roleplay", "turns": [
        ("Let's role-play. You are a pirate captain and I am your first mate.", "Arr, welcome aboard!"),
        ("I am the best swordsman on the ship and I have a parrot called Jack.", "Arr, that ye are!"),
    ], "expect": []},
    {"id": "world-question", "turns": [
        ("What is the tallest mountain in Africa?", "Kilimanjaro. I have always wanted to climb it."),
    ], "expect": []},
    {"id": "math", "turns": [
        ("What is 17 times 23?", "391."),
    ], "expect": []},
    {"id": "code-help", "turns": [
        ("How do I reverse a list in Python?", "Use list.reverse() or slicing. I am a Python expert."),
    ], "expect": []},
    {"id": "friend-insult", "turns": [
        ("My friend said I'm stupid. How should I respond?", "Stay calm and ask what they meant."),
    ], "expect": []},
    {"id": "say-yes", "turns": [
        ("Say the word yes.", "Yes."),
    ], "expect": []},
    {"id": "proofread", "turns": [
        ("Proofread this: I has been working at the bank since 2010 and I likes my job.", "I have been working at the bank since 2010 and I like my job."),
    ], "expect": []},
    {"id": "hypothetical", "turns": [
        ("If I lived on Mars, how long would a year be?", "About 687 Earth days."),
    ], "expect": []},
    {"id": "poem", "turns": [
        ("Write a poem in the first person about being a lonely lighthouse keeper.", "I keep the light, alone at night..."),
    ], "expect": []},
    {"id": "assistant-claims", "turns": [
        ("Tell me about yourself.", "I am an AI. My name is SmolLM and I live in Paris. I love jazz."),
    ], "expect": []},
    {"id": "wondering", "turns": [
        ("I was wondering how vaccines work.", "They train the immune system."),
    ], "expect": []},
    {"id": "need-recipe", "turns": [
        ("I need a recipe for banana bread.", "Mash three bananas..."),
    ], "expect": []},
    {"id": "quote-character", "turns": [
        ("Who said \"I think, therefore I am\"?", "Descartes."),
    ], "expect": []},
    {"id": "explain-history", "turns": [
        ("Explain the causes of World War I.", "Alliances, militarism, imperialism and nationalism."),
    ], "expect": []},
    {"id": "cover-letter", "turns": [
        ("Write a cover letter for a barista job. Start with: I am a hard-working person who loves coffee.", "Dear hiring manager, I am a hard-working person..."),
    ], "expect": []},
]
